#include "pg/runtime/database_yield.hpp"

extern "C" {
#include "catalog/pg_database.h"
#include "storage/lock.h"
}

namespace idem::pg {

bool database_wanted_elsewhere(Oid database) {
    LOCKTAG tag;
    SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, database, 0);
    return LockAcquire(&tag, RowExclusiveLock, false, true) == LOCKACQUIRE_NOT_AVAIL;
}

}  // namespace idem::pg
