#include "pg/keys/transition_log.hpp"

#include "pg/boundary/settings.hpp"
#include "pg/keys/key_counts.hpp"

extern "C" {
#include "lib/stringinfo.h"
}

namespace idem::pg {

namespace {

// A value as it goes into key=value: quoted when it holds a space, a quote
// or an equals sign, so that lines stay machine-readable.
void append_value(StringInfo line, const char* value) {
    if (strpbrk(value, " \"=\\\t\n") == nullptr && value[0] != '\0') {
        appendStringInfoString(line, value);
        return;
    }
    appendStringInfoChar(line, '"');
    for (const char* c = value; *c; ++c) {
        if (*c == '"' || *c == '\\') appendStringInfoChar(line, '\\');
        appendStringInfoChar(line, *c);
    }
    appendStringInfoChar(line, '"');
}

void append_field(StringInfo line, const char* name, const char* value) {
    appendStringInfo(line, " %s=", name);
    append_value(line, value);
}

}  // namespace

void log_transition(const KeyId& id, std::optional<Status> from,
                    std::optional<Status> to, std::optional<std::int64_t> token,
                    std::int32_t attempt, const char* reason) {
    count_key_transition(id.scope, from, to);
    if (!settings::log_transitions) return;
    StringInfoData line;
    initStringInfo(&line);
    appendStringInfoString(&line, "idempotency transition:");
    append_field(&line, "scope", text_to_cstring(id.scope));
    append_field(&line, "key", text_to_cstring(id.key));
    append_field(&line, "from", from ? status_label(*from) : "none");
    append_field(&line, "to", to ? status_label(*to) : "deleted");
    if (token)
        appendStringInfo(&line, " token=%lld", static_cast<long long>(*token));
    else
        appendStringInfoString(&line, " token=none");
    appendStringInfo(&line, " attempt=%d", attempt);
    if (reason) append_field(&line, "reason", reason);
    ereport(LOG, (errmsg("%s", line.data), errhidestmt(true)));
    pfree(line.data);
}

void log_step(const KeyId& id, Status status, const text* step, std::int32_t n,
              std::int64_t token, std::int32_t attempt) {
    if (!settings::log_transitions) return;
    StringInfoData line;
    initStringInfo(&line);
    appendStringInfoString(&line, "idempotency step:");
    append_field(&line, "scope", text_to_cstring(id.scope));
    append_field(&line, "key", text_to_cstring(id.key));
    append_field(&line, "status", status_label(status));
    append_field(&line, "step", text_to_cstring(step));
    appendStringInfo(&line, " n=%d token=%lld attempt=%d", n, static_cast<long long>(token),
                     attempt);
    ereport(LOG, (errmsg("%s", line.data), errhidestmt(true)));
    pfree(line.data);
}

}  // namespace idem::pg
