// The one exception type of the core: a SQLSTATE and a message.
// The PostgreSQL boundary turns it into ereport(ERROR) with that SQLSTATE.
#pragma once

#include <exception>
#include <string>

namespace idem {

namespace sqlstate {
inline constexpr const char* null_value = "22004";        // null_value_not_allowed
inline constexpr const char* invalid_parameter = "22023"; // invalid_parameter_value
inline constexpr const char* too_long = "22001";          // string_data_right_truncation
inline constexpr const char* limit_exceeded = "54000";    // program_limit_exceeded
inline constexpr const char* stale_token = "IK001";
inline constexpr const char* no_such_key = "IK002";
inline constexpr const char* wrong_state = "IK003";
inline constexpr const char* step_recorded = "IK004";     // the step's name is already recorded
inline constexpr const char* internal = "XX000";
}  // namespace sqlstate

class Error : public std::exception {
public:
    Error(const char* code, std::string message) : message_(std::move(message)) {
        for (int i = 0; i < 5; ++i) code_[i] = code[i];
        code_[5] = '\0';
    }
    const char* sqlstate() const noexcept { return code_; }
    const char* what() const noexcept override { return message_.c_str(); }

private:
    char code_[6];
    std::string message_;
};

// Throws Error with a printf-style message (at most 1 KiB).
[[noreturn]] void throw_error(const char* code, const char* format, ...)
    __attribute__((format(printf, 2, 3)));

}  // namespace idem
