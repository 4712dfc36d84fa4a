#include "pg/outbox/outbox_layout.hpp"

#include "pg/boundary/extension_objects.hpp"

namespace idem::pg {

namespace {

std::uint64_t known_generation = 0;
bool has_ready_queue = false;

}  // namespace

bool outbox_has_ready_queue() {
    const ExtensionObjects& objects = extension_objects();
    if (known_generation != objects.generation) {
        has_ready_queue = OidIsValid(objects.outbox) &&
                          get_attnum(objects.outbox, "ready_at") != InvalidAttrNumber;
        known_generation = objects.generation;
    }
    return has_ready_queue;
}

}  // namespace idem::pg
