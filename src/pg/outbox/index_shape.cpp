#include "pg/outbox/index_shape.hpp"

extern "C" {
#include "access/nbtree.h"
#include "catalog/pg_am.h"
#include "commands/defrem.h"
#include "nodes/primnodes.h"
#include "utils/array.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
}

namespace idem::pg {

namespace {

bool is_column(const Node* node, AttrNumber column) {
    return node != nullptr && IsA(node, Var) && reinterpret_cast<const Var*>(node)->varattno == column;
}

bool is_not_null(const Node* node, AttrNumber column) {
    if (node == nullptr || !IsA(node, NullTest)) return false;
    const auto* test = reinterpret_cast<const NullTest*>(node);
    return test->nulltesttype == IS_NOT_NULL && !test->argisrow &&
           is_column(reinterpret_cast<const Node*>(test->arg), column);
}

bool is_int8_zero(const Node* node) {
    if (node == nullptr || !IsA(node, Const)) return false;
    const auto* constant = reinterpret_cast<const Const*>(node);
    return constant->consttype == INT8OID && !constant->constisnull &&
           DatumGetInt64(constant->constvalue) == 0;
}

// hashtextextended(text_column, seed) in the collation of `collation`.
const List* hash_args(const Node* node, Oid collation) {
    if (node == nullptr || !IsA(node, FuncExpr)) return nullptr;
    const auto* call = reinterpret_cast<const FuncExpr*>(node);
    if (call->funcid != F_HASHTEXTEXTENDED || call->inputcollid != collation ||
        list_length(call->args) != 2)
        return nullptr;
    return call->args;
}

// hashtextextended(key, hashtextextended(topic, 0))
bool is_key_hash(const Node* node, const OutboxShapeColumns& c, Oid collation) {
    const List* outer = hash_args(node, collation);
    if (outer == nullptr || !is_column(static_cast<Node*>(linitial(outer)), c.key)) return false;
    const List* inner = hash_args(static_cast<Node*>(lsecond(outer)), collation);
    return inner != nullptr && is_column(static_cast<Node*>(linitial(inner)), c.topic) &&
           is_int8_zero(static_cast<Node*>(lsecond(inner)));
}

// COALESCE(key_seq, id)
bool is_key_place(const Node* node, const OutboxShapeColumns& c) {
    if (node == nullptr || !IsA(node, CoalesceExpr)) return false;
    const List* args = reinterpret_cast<const CoalesceExpr*>(node)->args;
    return list_length(args) == 2 && is_column(static_cast<Node*>(linitial(args)), c.key_seq) &&
           is_column(static_cast<Node*>(lsecond(args)), c.id);
}

// state = ANY ('{pending,in_flight,dead}')
bool is_live_state(const Node* node, const OutboxShapeColumns& c) {
    if (node == nullptr || !IsA(node, ScalarArrayOpExpr)) return false;
    const auto* any = reinterpret_cast<const ScalarArrayOpExpr*>(node);
    if (!any->useOr || get_opcode(any->opno) != F_ENUM_EQ || list_length(any->args) != 2 ||
        !is_column(static_cast<Node*>(linitial(any->args)), c.state))
        return false;
    const Node* values = static_cast<Node*>(lsecond(any->args));
    if (!IsA(values, Const) || reinterpret_cast<const Const*>(values)->constisnull) return false;
    ArrayType* array = DatumGetArrayTypeP(reinterpret_cast<const Const*>(values)->constvalue);
    int16 length = 0;
    bool by_value = false;
    char align = 0;
    get_typlenbyvalalign(ARR_ELEMTYPE(array), &length, &by_value, &align);
    Datum* states = nullptr;
    bool* nulls = nullptr;
    int count = 0;
    deconstruct_array(array, ARR_ELEMTYPE(array), length, by_value, align, &states, &nulls, &count);
    bool seen[3] = {false, false, false};
    for (int i = 0; i < count; ++i) {
        if (nulls[i]) return false;
        const Datum state = states[i];
        if (state == c.pending) seen[0] = true;
        else if (state == c.in_flight) seen[1] = true;
        else if (state == c.dead) seen[2] = true;
        else return false;
    }
    return seen[0] && seen[1] && seen[2];
}

// Key column `i` is ascending, nulls last, with the default btree operator
// class of its type and, for a collatable one, `collation`.
bool plain_order(Relation index, int i, Oid type, Oid collation) {
    const Oid opclass = GetDefaultOpClass(type, BTREE_AM_OID);
    return index->rd_indoption[i] == 0 && OidIsValid(opclass) &&
           index->rd_opfamily[i] == get_opclass_family(opclass) &&
           index->rd_indcollation[i] == collation;
}

// The key columns: a table column's number, or 0 for the next expression.
bool has_columns(Relation index, const AttrNumber* columns, int count) {
    if (IndexRelationGetNumberOfKeyAttributes(index) != count ||
        IndexRelationGetNumberOfAttributes(index) != count)
        return false;
    for (int i = 0; i < count; ++i)
        if (index->rd_index->indkey.values[i] != columns[i]) return false;
    return true;
}

}  // namespace

const char* outbox_index_name(OutboxIndex which) {
    switch (which) {
        case OutboxIndex::Ready: return "outbox_ready";
        case OutboxIndex::ReadyAll: return "outbox_ready_all";
        case OutboxIndex::KeyOrder: return "outbox_key_order";
    }
    return "";
}

const char* outbox_index_definition(OutboxIndex which) {
    switch (which) {
        case OutboxIndex::Ready:
            return "CREATE INDEX outbox_ready ON idempotency.outbox (topic, ready_at, id) "
                   "WHERE ready_at IS NOT NULL";
        case OutboxIndex::ReadyAll:
            return "CREATE INDEX outbox_ready_all ON idempotency.outbox (ready_at, id) "
                   "WHERE ready_at IS NOT NULL";
        case OutboxIndex::KeyOrder:
            return "CREATE INDEX outbox_key_order ON idempotency.outbox "
                   "(hashtextextended(key, hashtextextended(topic, 0)), COALESCE(key_seq, id), id) "
                   "WHERE state IN ('pending', 'in_flight', 'dead') AND key IS NOT NULL";
    }
    return "";
}

bool has_outbox_index_shape(Relation index, OutboxIndex which, const OutboxShapeColumns& c) {
    const Form_pg_index form = index->rd_index;
    if (index->rd_rel->relam != BTREE_AM_OID || !form->indisvalid || !form->indisready ||
        !form->indislive)
        return false;
    List* expressions = RelationGetIndexExpressions(index);
    List* predicate = RelationGetIndexPredicate(index);
    switch (which) {
        case OutboxIndex::Ready: {
            const AttrNumber columns[] = {c.topic, c.ready_at, c.id};
            return has_columns(index, columns, 3) && expressions == NIL &&
                   plain_order(index, 0, TEXTOID, c.topic_collation) &&
                   plain_order(index, 1, TIMESTAMPTZOID, InvalidOid) &&
                   plain_order(index, 2, INT8OID, InvalidOid) && list_length(predicate) == 1 &&
                   is_not_null(static_cast<Node*>(linitial(predicate)), c.ready_at);
        }
        case OutboxIndex::ReadyAll: {
            const AttrNumber columns[] = {c.ready_at, c.id};
            return has_columns(index, columns, 2) && expressions == NIL &&
                   plain_order(index, 0, TIMESTAMPTZOID, InvalidOid) &&
                   plain_order(index, 1, INT8OID, InvalidOid) && list_length(predicate) == 1 &&
                   is_not_null(static_cast<Node*>(linitial(predicate)), c.ready_at);
        }
        case OutboxIndex::KeyOrder: {
            const AttrNumber columns[] = {0, 0, c.id};
            return has_columns(index, columns, 3) && list_length(expressions) == 2 &&
                   is_key_hash(static_cast<Node*>(linitial(expressions)), c, c.key_collation) &&
                   is_key_place(static_cast<Node*>(lsecond(expressions)), c) &&
                   plain_order(index, 0, INT8OID, InvalidOid) &&
                   plain_order(index, 1, INT8OID, InvalidOid) &&
                   plain_order(index, 2, INT8OID, InvalidOid) && list_length(predicate) == 2 &&
                   is_live_state(static_cast<Node*>(linitial(predicate)), c) &&
                   is_not_null(static_cast<Node*>(lsecond(predicate)), c.key);
        }
    }
    return false;
}

}  // namespace idem::pg
