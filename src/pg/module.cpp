// The module's entry: the magic block and _PG_init.
#include "pg/guard.hpp"
#include "pg/settings.hpp"

extern "C" {
PG_MODULE_MAGIC;
PGDLLEXPORT void _PG_init(void);
}

extern "C" void _PG_init(void) {
    // Defining GUCs cannot throw; nothing here allocates C++ objects.
    idem::pg::settings::define();
}
