#include "pg/boundary/args.hpp"

#include "core/error.hpp"
#include "pg/boundary/settings.hpp"

namespace idem::pg {

namespace {

Micros interval_arg(FunctionCallInfo fcinfo, int n, const char* name) {
    Micros value = 0;
    if (!interval_to_micros(PG_GETARG_INTERVAL_P(n), &value))
        throw Error(sqlstate::invalid_parameter,
                    std::string(name) + " is out of range (it must be a finite interval)");
    return value;
}

void require(FunctionCallInfo fcinfo, int n, const char* name) {
    if (PG_ARGISNULL(n)) throw_null_argument(name);
}

}  // namespace

text* name_arg(FunctionCallInfo fcinfo, int n, const char* name, std::size_t max_bytes) {
    require(fcinfo, n, name);
    text* value = PG_GETARG_TEXT_PP(n);
    check_name(name, text_bytes(value), max_bytes);
    return value;
}

text* scope_arg(FunctionCallInfo fcinfo, int n) {
    return name_arg(fcinfo, n, "scope", kMaxScopeBytes);
}

text* optional_name_arg(FunctionCallInfo fcinfo, int n, const char* name) {
    if (PG_ARGISNULL(n)) return nullptr;
    text* value = PG_GETARG_TEXT_PP(n);
    check_optional_name(name, text_bytes(value));
    return value;
}

std::int64_t token_arg(FunctionCallInfo fcinfo, int n) {
    require(fcinfo, n, "token");
    return PG_GETARG_INT64(n);
}

text* value_text_arg(FunctionCallInfo fcinfo, int n, const char* name) {
    require(fcinfo, n, name);
    text* value = PG_GETARG_TEXT_PP(n);
    check_value_size(name, text_bytes(value), static_cast<std::size_t>(settings::max_value_bytes));
    return value;
}

Datum optional_jsonb_arg(FunctionCallInfo fcinfo, int n, const char* name) {
    if (PG_ARGISNULL(n)) return 0;
    Jsonb* value = PG_GETARG_JSONB_P(n);
    check_value_size(name, VARSIZE(value) - VARHDRSZ,
                     static_cast<std::size_t>(settings::max_value_bytes));
    return JsonbPGetDatum(value);
}

Micros lease_arg(FunctionCallInfo fcinfo, int n, const char* name) {
    const Micros max = settings::ms(settings::max_lease_ms);
    if (PG_ARGISNULL(n)) {
        const Micros lease = settings::ms(settings::default_lease_ms);
        check_positive_interval("idempotency.default_lease", lease, max, "idempotency.max_lease");
        return lease;
    }
    const Micros value = interval_arg(fcinfo, n, name);
    check_positive_interval(name, value, max, "idempotency.max_lease");
    return value;
}

std::optional<Micros> wait_arg(FunctionCallInfo fcinfo, int n) {
    if (PG_ARGISNULL(n)) return std::nullopt;
    const Micros value = interval_arg(fcinfo, n, "wait");
    check_positive_interval("wait", value, settings::ms(settings::max_lease_ms),
                            "idempotency.max_lease");
    return value;
}

std::optional<Micros> span_arg(FunctionCallInfo fcinfo, int n, const char* name) {
    if (PG_ARGISNULL(n)) return std::nullopt;
    const Micros value = interval_arg(fcinfo, n, name);
    check_nonnegative_interval(name, value);
    return value;
}

std::optional<Micros> optional_span_arg(FunctionCallInfo fcinfo, int n, const char* name) {
    if (n >= PG_NARGS()) return std::nullopt;
    return span_arg(fcinfo, n, name);
}

}  // namespace idem::pg
