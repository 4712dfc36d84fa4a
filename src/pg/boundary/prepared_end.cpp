#include "pg/boundary/prepared_end.hpp"

#include "pg/boundary/postgres.hpp"

extern "C" {
#include "tcop/utility.h"
}

namespace idem::pg {

namespace {

void (*callbacks[kPreparedEndCallbacks])() = {};
int callback_count = 0;
ProcessUtility_hook_type previous_hook = nullptr;

bool ends_prepared(const Node* statement) {
    if (!IsA(statement, TransactionStmt)) return false;
    const auto kind = reinterpret_cast<const TransactionStmt*>(statement)->kind;
    return kind == TRANS_STMT_COMMIT_PREPARED || kind == TRANS_STMT_ROLLBACK_PREPARED;
}

void process_utility(PlannedStmt* statement, const char* query, bool read_only_tree,
                     ProcessUtilityContext context, ParamListInfo params, QueryEnvironment* env,
                     DestReceiver* dest, QueryCompletion* completion) {
    if (previous_hook != nullptr)
        previous_hook(statement, query, read_only_tree, context, params, env, dest, completion);
    else
        standard_ProcessUtility(statement, query, read_only_tree, context, params, env, dest,
                                completion);
    // The prepared transaction has ended (an error would not reach here).
    if (ends_prepared(statement->utilityStmt))
        for (int i = 0; i < callback_count; ++i) callbacks[i]();
}

}  // namespace

void after_prepared_ends(void (*callback)()) {
    if (callback_count == kPreparedEndCallbacks)
        elog(ERROR, "idempotency: too many callbacks after COMMIT PREPARED");
    if (callback_count == 0) {
        previous_hook = ProcessUtility_hook;
        ProcessUtility_hook = process_utility;
    }
    callbacks[callback_count++] = callback;
}

}  // namespace idem::pg
