// Every statement the module plans (pg/access/spi.hpp) starts with a marker, and
// is checked at each parse analysis, first planning or re-planning, to read
// and write only the extension's own tables (pg/access/extension_objects.hpp): a
// table that resolves to anything else stops the statement before it runs,
// so no trigger or rule of a look-alike table ever runs as the owner.
#pragma once

namespace idem::pg {

// The marker the module's statements start with.
inline constexpr char kStatementMarker[] = "/* idempotency */ ";

// Installs the check; called once from _PG_init.
void install_statement_guard();

}  // namespace idem::pg
