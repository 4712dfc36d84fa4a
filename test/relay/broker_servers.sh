# NATS (with JetStream) and RabbitMQ for the relay's broker tests and
# benchmark, sourced after test/lib/common.sh and harness.sh. Each runs as
# its own OS user (nats, rabbitmq: the Debian packages create them), in a
# session of its own (setsid) so that its process group, with every helper
# process it starts, is stopped as one; on 127.0.0.1 only, with its data
# under $dir. RabbitMQ gets its own node name, data folder and Erlang port
# mapper, on ports of their own: nothing of the system's own service is
# used, and nothing outlives the run.
#
# Callers set dir and call broker_setup PORT (PostgreSQL's port; the
# brokers take the next seven); broker_groups collects the process groups,
# for stop_brokers.

broker_groups=()

# broker_setup PORT: the ports, the binaries and the brokers.py command.
broker_setup() {
    port=$1
    nats_port=$((port + 1))
    amqp_port=$((port + 2))
    amqp_dist_port=$((port + 3))
    epmd_port=$((port + 4))
    nats_auth_port=$((port + 5))  # NATS that wants a password (brokers.sh)
    nats_tls_port=$((port + 6))   # NATS over TLS (brokers.sh)
    amqps_port=$((port + 7))      # RabbitMQ's TLS listener (with a CA in $dir/tls)
    bindir=$(pg_bindir)
    relay_bin=${IDEM_RELAY:-$bindir/idem-relay}
    python=/usr/bin/python3
    brokers="$python $here/brokers.py"
}

# group_alive PGID: a process of the group still runs (zombies do not
# count: where PID 1 does not reap, helpers a broker left stay so).
group_alive() { ps -e -o pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'; }
# stop_group PGID: SIGTERM to a process group, SIGKILL after 30 s.
stop_group() {
    local group=$1 deadline=$((SECONDS + 30))
    group_alive "$group" || return 0
    kill -TERM -- "-$group" 2>/dev/null
    while group_alive "$group"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            kill -KILL -- "-$group" 2>/dev/null
            deadline=$((SECONDS + 30))
        fi
        sleep 0.1
    done
}

# prepare_brokers: their folders and RabbitMQ's configuration.
prepare_brokers() {
    mkdir -p "$dir/nats" "$dir/rabbitmq" || return 1
    chown nats "$dir/nats" || return 1
    cat >"$dir/rabbitmq/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$amqp_port
loopback_users = none
log.console = false
log.file.level = warning
CONF
    # Over TLS too, when the caller made a CA ($dir/tls, make_test_ca).
    if [ -s "$dir/tls/server.pem" ]; then
        cat >>"$dir/rabbitmq/rabbitmq.conf" <<CONF
listeners.ssl.default = 127.0.0.1:$amqps_port
ssl_options.cacertfile = $dir/tls/ca.pem
ssl_options.certfile = $dir/tls/server.pem
ssl_options.keyfile = $dir/tls/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
CONF
    fi
    chown -R rabbitmq "$dir/rabbitmq"
}

start_nats() {
    setsid runuser -u nats -- nats-server -js -a 127.0.0.1 -p "$nats_port" \
        -sd "$dir/nats/store" -l "$dir/nats/server.log" >/dev/null 2>&1 </dev/null &
    nats_group=$!
    broker_groups+=("$nats_group")
    wait_until 60 $brokers nats-up "$nats_port"
}
stop_nats() { stop_group "$nats_group"; }

start_rabbitmq() {
    if [ -z "${epmd_group:-}" ] || ! group_alive "$epmd_group"; then
        # The node would otherwise start a port mapper daemon on 4369 that
        # outlives it.
        setsid runuser -u rabbitmq -- env ERL_EPMD_ADDRESS=127.0.0.1 epmd -port "$epmd_port" \
            >/dev/null 2>&1 </dev/null &
        epmd_group=$!
        broker_groups+=("$epmd_group")
    fi
    setsid runuser -u rabbitmq -- env HOME="$dir/rabbitmq" RABBITMQ_NODENAME=idem-test@localhost \
        RABBITMQ_BASE="$dir/rabbitmq" RABBITMQ_MNESIA_BASE="$dir/rabbitmq/mnesia" \
        RABBITMQ_LOG_BASE="$dir/rabbitmq/log" RABBITMQ_CONFIG_FILE="$dir/rabbitmq/rabbitmq.conf" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$dir/rabbitmq/enabled_plugins" \
        RABBITMQ_PID_FILE="$dir/rabbitmq/pid" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
        RABBITMQ_NODE_PORT="$amqp_port" RABBITMQ_DIST_PORT="$amqp_dist_port" \
        ERL_EPMD_PORT="$epmd_port" ERL_EPMD_ADDRESS=127.0.0.1 \
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
        /usr/lib/rabbitmq/bin/rabbitmq-server >>"$dir/rabbitmq/server.out" 2>&1 </dev/null &
    rabbitmq_group=$!
    broker_groups+=("$rabbitmq_group")
    wait_until 180 $brokers amqp-up "$amqp_port"
}
stop_rabbitmq() { stop_group "$rabbitmq_group"; }
# rabbitmqctl ARGS...: the test node's (its cookie, port mapper and name);
# the command's own Erlang node on loopback too.
rabbitmqctl_test() {
    runuser -u rabbitmq -- env HOME="$dir/rabbitmq" RABBITMQ_NODENAME=idem-test@localhost \
        ERL_EPMD_PORT="$epmd_port" ERL_EPMD_ADDRESS=127.0.0.1 \
        RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
        /usr/lib/rabbitmq/bin/rabbitmqctl -n idem-test@localhost "$@" </dev/null
}

# stop_brokers: every process group started here, the port mapper last.
stop_brokers() {
    local group
    for group in "${broker_groups[@]}"; do
        [ "$group" = "${epmd_group:-}" ] || stop_group "$group"
    done
    # The port mapper ignores SIGTERM; it is asked to stop.
    if [ -n "${epmd_group:-}" ] && group_alive "$epmd_group"; then
        runuser -u rabbitmq -- env ERL_EPMD_PORT="$epmd_port" epmd -kill >/dev/null 2>&1
        stop_group "$epmd_group"
    fi
    return 0
}

# brokers_gone: none of their processes left and none of their ports
# listening.
brokers_gone() {
    local group
    for group in "${broker_groups[@]}"; do group_alive "$group" && return 1; done
    ! ss -ltn | grep -qE "127\.0\.0\.1:($nats_port|$amqp_port|$amqp_dist_port|$epmd_port|$nats_auth_port|$nats_tls_port|$amqps_port) "
}
