#include "relay/db/pg_text.hpp"

#include <charconv>
#include <cstring>

namespace idem::relay {

std::string array_literal(const std::vector<std::string>& items) {
    std::string out = "{";
    for (std::size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ',';
        out += '"';
        for (const char c : items[i]) {
            if (c == '"' || c == '\\') out += '\\';
            out += c;
        }
        out += '"';
    }
    out += '}';
    return out;
}

std::string id_array(const std::vector<std::int64_t>& ids) {
    std::string literal = "{";
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (i > 0) literal += ',';
        literal += std::to_string(ids[i]);
    }
    literal += '}';
    return literal;
}

double parse_double(const char* text) {
    double value = 0;
    const char* end = text + std::strlen(text);
    if (std::from_chars(text, end, value).ec != std::errc()) return 0;
    return value;
}

std::string one_line(const char* message) {
    std::string text = message != nullptr ? message : "";
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    for (char& c : text)
        if (c == '\n' || c == '\t') c = ' ';
    return text;
}

}  // namespace idem::relay
