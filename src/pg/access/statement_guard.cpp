#include "pg/access/statement_guard.hpp"

#include <cstring>

#include "pg/access/extension_objects.hpp"
#include "pg/boundary/postgres.hpp"

extern "C" {
#include "parser/analyze.h"
}

namespace idem::pg {

namespace {

post_parse_analyze_hook_type previous_hook = nullptr;

bool refuse_foreign_relations(Node* node, void* context) {
    if (node == nullptr) return false;
    if (IsA(node, RangeTblEntry)) {
        const auto* entry = reinterpret_cast<RangeTblEntry*>(node);
        if (entry->rtekind == RTE_RELATION && !is_extension_table(entry->relid))
            ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
                            errmsg("idempotency: a statement of the extension resolved to "
                                   "relation \"%s\", which is not one of its tables",
                                   get_rel_name(entry->relid)),
                            errhint("Something has replaced the extension's objects under "
                                    "their names; check schema \"idempotency\".")));
        return false;
    }
    if (IsA(node, Query))
        return walk_query(reinterpret_cast<Query*>(node), refuse_foreign_relations, context,
                          QTW_EXAMINE_RTES_BEFORE);
    return walk_expression(node, refuse_foreign_relations, context);
}

bool is_module_statement(const ParseState* state) {
    return state->p_sourcetext != nullptr &&
           std::strncmp(state->p_sourcetext, kStatementMarker, sizeof kStatementMarker - 1) == 0;
}

void check_statement(ParseState* state, Query* query, JumbleState* jumble) {
    if (previous_hook) previous_hook(state, query, jumble);
    if (is_module_statement(state)) refuse_foreign_relations(reinterpret_cast<Node*>(query), nullptr);
}

}  // namespace

void install_statement_guard() {
    previous_hook = post_parse_analyze_hook;
    post_parse_analyze_hook = check_statement;
}

}  // namespace idem::pg
