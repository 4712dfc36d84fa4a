#include "core/error.hpp"

#include <cstdarg>
#include <cstdio>
#include "core/cpp_only.hpp"

namespace idem {

void throw_error(const char* code, const char* format, ...) {
    char message[1024];
    va_list args;
    va_start(args, format);
    std::vsnprintf(message, sizeof message, format, args);
    va_end(args);
    throw Error(code, message);
}

}  // namespace idem
