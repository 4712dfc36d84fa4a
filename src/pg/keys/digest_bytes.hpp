// The bytes every digest of text is taken over (tombstone digests, request
// fingerprints, step keys): its UTF-8 bytes, whatever the database's
// encoding, so that a dump restored into a database of another encoding,
// and a client computing the same digest in its own language, agree. A
// SQL_ASCII database's text has no declared encoding: its bytes are taken
// as they are (the same as UTF-8 for text written in UTF-8), where a
// conversion would refuse a byte that is not valid UTF-8.
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

struct DigestBytes {
    const char* data;
    int length;
    bool converted;  // data is a palloc'd copy, not the text's own bytes
};

// `bytes` themselves when they need no conversion, else a palloc'd copy.
DigestBytes digest_bytes(const char* bytes, int length);
// Frees the copy, if digest_bytes made one.
void release(const DigestBytes& bytes);
inline DigestBytes digest_bytes(const text* value) {
    return digest_bytes(VARDATA_ANY(value), static_cast<int>(VARSIZE_ANY_EXHDR(value)));
}

// Whether text in this database is hashed as it is stored (UTF-8 and
// SQL_ASCII databases), so that its digest_bytes are its own bytes.
bool digests_native_bytes();

}  // namespace idem::pg
