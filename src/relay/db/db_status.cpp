#include "relay/db/db_status.hpp"

#include <cstring>

namespace idem::relay {

namespace {

bool starts_with(const char* text, const char* prefix) {
    return strncmp(text, prefix, strlen(prefix)) == 0;
}

}  // namespace

DbStatus classify_failure(const char* sqlstate, bool connection_ok) {
    if (!connection_ok || sqlstate == nullptr || starts_with(sqlstate, "08") ||
        starts_with(sqlstate, "57P") || strcmp(sqlstate, "25006") == 0)
        return DbStatus::Lost;
    if (starts_with(sqlstate, "53") || starts_with(sqlstate, "58") ||
        strcmp(sqlstate, "40001") == 0 || strcmp(sqlstate, "40P01") == 0 ||
        strcmp(sqlstate, "55P03") == 0 || strcmp(sqlstate, "57014") == 0)
        return DbStatus::Transient;
    return DbStatus::Fatal;
}

}  // namespace idem::relay
