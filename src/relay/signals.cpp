#include "relay/signals.hpp"

#include <csignal>
#include <pthread.h>

namespace idem::relay {

namespace {

volatile sig_atomic_t stop_count = 0;
const WakePipe* wake_pipe = nullptr;

extern "C" void on_stop_signal(int) {
    stop_count = stop_count + 1;
    if (wake_pipe != nullptr) wake_pipe->notify();
}

}  // namespace

void install_signal_handlers(const WakePipe& wake) {
    wake_pipe = &wake;
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGINT, &action, nullptr);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, nullptr);
}

int stop_requests() { return stop_count; }

void block_stop_signals(bool block) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(block ? SIG_BLOCK : SIG_UNBLOCK, &set, nullptr);
}

}  // namespace idem::relay
