#include "relay/json.hpp"

#include <cstdio>

namespace idem::relay {

void append_json_string(std::string& out, std::string_view s) {
    out += '"';
    for (const char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char escaped[8];
                    snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned char>(c));
                    out += escaped;
                } else {
                    out += c;
                }
        }
    }
    out += '"';
}

namespace {

class Reader {
public:
    explicit Reader(std::string_view text) : text_(text) {}

    void skip_space() {
        while (pos_ < text_.size() &&
               (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                text_[pos_] == '\r'))
            ++pos_;
    }
    bool at_end() const { return pos_ >= text_.size(); }
    char peek() const { return at_end() ? '\0' : text_[pos_]; }
    bool consume(char c) {
        skip_space();
        if (peek() != c) return false;
        ++pos_;
        return true;
    }

    // A string literal at the current position, decoded to UTF-8.
    bool string(std::string* out) {
        skip_space();
        if (peek() != '"') return false;
        ++pos_;
        out->clear();
        while (!at_end()) {
            const char c = text_[pos_++];
            if (c == '"') return true;
            if (c != '\\') {
                out->push_back(c);
                continue;
            }
            if (at_end()) return false;
            const char e = text_[pos_++];
            switch (e) {
                case '"': out->push_back('"'); break;
                case '\\': out->push_back('\\'); break;
                case '/': out->push_back('/'); break;
                case 'b': out->push_back('\b'); break;
                case 'f': out->push_back('\f'); break;
                case 'n': out->push_back('\n'); break;
                case 'r': out->push_back('\r'); break;
                case 't': out->push_back('\t'); break;
                case 'u': {
                    unsigned code = 0;
                    if (!hex4(&code)) return false;
                    if (code >= 0xD800 && code <= 0xDBFF) {
                        unsigned low = 0;
                        if (pos_ + 1 < text_.size() && text_[pos_] == '\\' &&
                            text_[pos_ + 1] == 'u') {
                            pos_ += 2;
                            if (!hex4(&low) || low < 0xDC00 || low > 0xDFFF) return false;
                            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                        } else {
                            return false;
                        }
                    }
                    utf8(code, out);
                    break;
                }
                default: return false;
            }
        }
        return false;
    }

    // Skips one value of any kind; its text is [start, pos_).
    bool skip_value() {
        skip_space();
        const char c = peek();
        if (c == '"') {
            std::string ignored;
            return string(&ignored);
        }
        if (c == '{' || c == '[') {
            const char close = c == '{' ? '}' : ']';
            ++pos_;
            skip_space();
            if (peek() == close) {
                ++pos_;
                return true;
            }
            for (;;) {
                if (c == '{') {
                    std::string ignored;
                    if (!string(&ignored) || !consume(':')) return false;
                }
                if (!skip_value()) return false;
                skip_space();
                if (consume(',')) continue;
                return consume(close);
            }
        }
        // A number or a literal: up to the next delimiter.
        const std::size_t start = pos_;
        while (!at_end() && text_[pos_] != ',' && text_[pos_] != '}' && text_[pos_] != ']' &&
               text_[pos_] != ' ' && text_[pos_] != '\n' && text_[pos_] != '\t' &&
               text_[pos_] != '\r')
            ++pos_;
        return pos_ > start;
    }

    std::size_t position() const { return pos_; }
    std::string_view slice(std::size_t from, std::size_t to) const {
        return text_.substr(from, to - from);
    }

private:
    bool hex4(unsigned* out) {
        if (pos_ + 4 > text_.size()) return false;
        unsigned value = 0;
        for (int i = 0; i < 4; ++i) {
            const char h = text_[pos_++];
            value <<= 4;
            if (h >= '0' && h <= '9') value |= static_cast<unsigned>(h - '0');
            else if (h >= 'a' && h <= 'f') value |= static_cast<unsigned>(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') value |= static_cast<unsigned>(h - 'A' + 10);
            else return false;
        }
        *out = value;
        return true;
    }

    static void utf8(unsigned code, std::string* out) {
        if (code < 0x80) {
            out->push_back(static_cast<char>(code));
        } else if (code < 0x800) {
            out->push_back(static_cast<char>(0xC0 | (code >> 6)));
            out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
        } else if (code < 0x10000) {
            out->push_back(static_cast<char>(0xE0 | (code >> 12)));
            out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
            out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
        } else {
            out->push_back(static_cast<char>(0xF0 | (code >> 18)));
            out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
            out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
            out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
        }
    }

    std::string_view text_;
    std::size_t pos_ = 0;
};

}  // namespace

bool parse_json_object(std::string_view text, JsonMembers* members) {
    members->clear();
    Reader reader(text);
    if (!reader.consume('{')) return false;
    reader.skip_space();
    if (reader.consume('}')) {
        reader.skip_space();
        return reader.at_end();
    }
    for (;;) {
        std::string name;
        if (!reader.string(&name) || !reader.consume(':')) return false;
        reader.skip_space();
        std::string value;
        if (reader.peek() == '"') {
            if (!reader.string(&value)) return false;
        } else {
            const std::size_t start = reader.position();
            if (!reader.skip_value()) return false;
            value = std::string(reader.slice(start, reader.position()));
        }
        members->emplace_back(std::move(name), std::move(value));
        if (reader.consume(',')) continue;
        if (!reader.consume('}')) return false;
        reader.skip_space();
        return reader.at_end();
    }
}

}  // namespace idem::relay
