#include "relay/loop/signals.hpp"

#include <csignal>
#include <pthread.h>

namespace idem::relay {

namespace {

constexpr std::size_t kMaxPipes = 16;

volatile sig_atomic_t stop_count = 0;
// Written before the handlers are installed and by forget_wake_pipes(),
// read only by them.
const WakePipe* wake_pipes[kMaxPipes] = {};
volatile sig_atomic_t wake_pipe_count = 0;

extern "C" void on_stop_signal(int) {
    stop_count = stop_count + 1;
    for (sig_atomic_t i = 0; i < wake_pipe_count; ++i) wake_pipes[i]->notify();
}

}  // namespace

void install_signal_handlers(const std::vector<const WakePipe*>& wakes) {
    sig_atomic_t count = 0;
    for (const WakePipe* wake : wakes)
        if (count < static_cast<sig_atomic_t>(kMaxPipes)) wake_pipes[count++] = wake;
    wake_pipe_count = count;
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &action, nullptr);
    sigaction(SIGINT, &action, nullptr);
    sigaction(SIGHUP, &action, nullptr);
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, nullptr);
}

void forget_wake_pipes() { wake_pipe_count = 0; }

int stop_requests() { return stop_count; }

void block_stop_signals(bool block) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(block ? SIG_BLOCK : SIG_UNBLOCK, &set, nullptr);
}

}  // namespace idem::relay
