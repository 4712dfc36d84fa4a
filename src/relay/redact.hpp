// URLs as the relay prints them: a sink URL may carry a secret in its
// userinfo (a password, or a token given as the user name) or its query
// (?token=...), and logs are read by more people than the configuration.
#pragma once

#include <string>
#include <string_view>

namespace idem::relay {

// The URL with every part of its userinfo (user and password) and the value
// of every query parameter replaced by "***"; works on text that does not
// parse as a URL too.
std::string redact_url(std::string_view url);

}  // namespace idem::relay
