// What a failed database call means for the caller, from its SQLSTATE: carry
// on later on the same connection, reconnect, or give up. A lost connection,
// a server shutting down or a standby (read-only: reconnecting may find the
// primary) is Lost; a conflict, a lock or statement timeout, or a resource
// shortage is Transient; anything else (no extension, no privilege, a bad
// argument) is Fatal: retrying will not fix it.
#pragma once

namespace idem::relay {

enum class DbStatus {
    Ok,
    Transient,  // failed, connection still fine: try again later
    Lost,       // the connection is gone (closed by this call): reconnect
    Fatal,      // a failure that retrying will not fix (no extension, no privilege, bad lease)
};

// sqlstate: the failure's SQLSTATE, nullptr when it had none (the
// connection broke). connection_ok: the connection is still usable.
DbStatus classify_failure(const char* sqlstate, bool connection_ok);

}  // namespace idem::relay
