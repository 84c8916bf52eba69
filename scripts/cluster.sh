#!/usr/bin/env bash
# A pretend cluster on one machine: H "hosts", each a network namespace with
# its own hostname (UTS namespace) and an address on a bridge, their links
# shaped with tc, reachable by mpirun through an rsh agent that enters the
# namespace instead of logging in with ssh.
#
#   scripts/cluster.sh up H [--bw RATE] [--delay TIME] [--cpus N] [--prefix P] [--subnet A.B.C]
#   scripts/cluster.sh status [--prefix P]
#   scripts/cluster.sh args [--prefix P]      # the mpirun options that use it
#   scripts/cluster.sh mpirun [--prefix P] MPIRUN_ARGS...
#   scripts/cluster.sh down [--prefix P]
#
#   --bw RATE     each host's link, both directions (tc tbf; default 10gbit,
#                 "none" for unshaped)
#   --delay TIME  one-way delay added on each host's link (tc netem). On a
#                 kernel without netem `up` fails saying so and removes what
#                 it made; the delay itself has not been tried on a kernel
#                 with netem
#   --cpus N      each host's processes share at most N cores' time (a cpu
#                 cgroup per host, CFS quota; e.g. 0.5: 4 hosts on 2 cores
#                 each get a fair half, as separate machines would their own
#                 cores); default: no limit
#   --prefix P    names: bridge Pbr0, namespaces P-h0..., hostnames P-h0...,
#                 state in /run/dtrain-cluster-P (default "dt")
#   --subnet ABC  the private /24 used (default 10.77.0): hosts get .1 to .H,
#                 the bridge (where mpirun runs) .254
#
# `up` prints the hostfile's path as its last line; every host has as many
# slots as this machine has cores. `up` on a cluster that is already up with
# the same H does nothing but print it; on failure it removes what it made.
# `down` kills every process left inside the hosts and removes the
# namespaces, the bridge and the state directory; it is safe to run twice.
#
#   hf=$(scripts/cluster.sh up 2 --bw 1gbit | tail -1)
#   scripts/cluster.sh mpirun --allow-run-as-root -np 4 --map-by node \
#       build/dtrain train configs/fashion-mlp.ini
#   scripts/cluster.sh down
set -euo pipefail

die() { echo "cluster.sh: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit 2; }

cmd=${1:-}
[ -n "$cmd" ] || usage
case "$cmd" in -h|--help|help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;; esac
shift
hosts= bw=10gbit delay= cpus= prefix=dt subnet=10.77.0
if [ "$cmd" = up ]; then
    [ $# -gt 0 ] || die "up: missing the number of hosts (up H)"
    hosts=$1; shift
    [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 200 ] ||
        die "up: number of hosts '$hosts': expected an integer from 1 to 200"
fi
rest=()
while [ $# -gt 0 ]; do
    case "$1" in
    --bw) [ $# -ge 2 ] || die "--bw: missing a rate (e.g. 10gbit)"; bw=$2; shift 2 ;;
    --delay) [ $# -ge 2 ] || die "--delay: missing a time (e.g. 50us)"; delay=$2; shift 2 ;;
    --cpus) [ $# -ge 2 ] || die "--cpus: missing a number of cores (e.g. 0.5)"; cpus=$2; shift 2 ;;
    --prefix) [ $# -ge 2 ] || die "--prefix: missing a name"; prefix=$2; shift 2 ;;
    --subnet) [ $# -ge 2 ] || die "--subnet: missing the first three numbers of a /24 (e.g. 10.77.0)"; subnet=$2; shift 2 ;;
    -h|--help) usage ;;
    *) if [ "$cmd" = mpirun ] || [ "$cmd" = rsh ]; then rest=("$@"); break; fi
       die "$cmd: unknown argument '$1'" ;;
    esac
done
# (tc's netem would read it: checked here, so that a bad value is named as such)
[ -z "$delay" ] || [[ "$delay" =~ ^[0-9]+(\.[0-9]+)?(us|ms|s)$ ]] ||
    die "--delay '$delay': expected a time such as 50us, 2ms or 0.1s"
[[ "$prefix" =~ ^[a-z][a-z0-9]{0,5}$ ]] || die "--prefix '$prefix': expected 1 to 6 lowercase letters or digits, starting with a letter"
[[ "$subnet" =~ ^(10|192\.168|172\.(1[6-9]|2[0-9]|3[01]))(\.[0-9]{1,3}){1,2}$ ]] && [ "$(echo "$subnet" | tr -cd . | wc -c)" -eq 2 ] ||
    die "--subnet '$subnet': expected the first three numbers of a private /24 (10.x.y, 172.16-31.y or 192.168.y)"

state=/run/dtrain-cluster-$prefix
bridge=${prefix}br0
cpuroot=/sys/fs/cgroup/cpu  # cgroup v1; v2: /sys/fs/cgroup with cpu.max
[ -f /sys/fs/cgroup/cgroup.controllers ] && cpuroot=/sys/fs/cgroup
host_cg() { echo "$cpuroot/dtrain-cluster-$prefix-h$1"; }
host_name() { echo "$prefix-h$1"; }

need_root() {
    [ "$(id -u)" -eq 0 ] || die "$cmd: needs root (network namespaces, a bridge and tc)"
    for t in ip tc unshare nsenter; do
        command -v $t >/dev/null || die "$cmd: '$t' is not installed (Debian packages iproute2, util-linux)"
    done
}

# The processes running inside host i's network namespace.
host_pids() { ip netns pids "$(host_name "$1")" 2>/dev/null || true; }

do_down() {
    local n ns pids
    if [ -f "$state/hosts" ]; then n=$(cat "$state/hosts"); else n=0; fi
    # also namespaces left by an `up` that died before writing hosts
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$prefix-h[0-9]+$" || true); do
        local i=${ns#"$prefix"-h}
        [ "$i" -ge "$n" ] && n=$((i + 1))
    done
    local killed=
    for ((i = 0; i < n; i++)); do
        pids=$(host_pids "$i")
        [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
        killed="$killed $pids"
    done
    for ((i = 0; i < n; i++)); do
        ns=$(host_name "$i")
        for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(host_pids "$i")" ] && break; sleep 0.1; done
        if [ -e "$state/uts/$ns" ]; then umount "$state/uts/$ns" 2>/dev/null || true; fi
        if ip netns list | awk '{print $1}' | grep -qx "$ns"; then ip netns del "$ns"; fi
        ip link del "${prefix}v$i" 2>/dev/null || true
        if [ -d "$(host_cg "$i")" ]; then rmdir "$(host_cg "$i")" 2>/dev/null || true; fi
    done
    ip link del "$bridge" 2>/dev/null || true
    # what killed processes leave in /dev/shm: Open MPI's shared-memory
    # segments (named after the host) and the OpenMP runtime's registration
    rm -f /dev/shm/vader_segment."$prefix"-h[0-9]*
    for p in $killed; do rm -f /dev/shm/__KMP_REGISTERED_LIB_"$p"_*; done
    rm -rf "$state"
}

shape() { # shape DEV [NETNS]: egress of DEV limited to bw, delayed by delay
    local dev=$1 tcx=(tc)
    [ $# -ge 2 ] && tcx=(ip netns exec "$2" tc)
    if [ -n "$delay" ]; then
        local rate=()
        [ "$bw" != none ] && rate=(rate "$bw")
        local err why=
        if ! err=$("${tcx[@]}" qdisc add dev "$dev" root netem delay "$delay" "${rate[@]}" 2>&1); then
            zgrep -qx "# CONFIG_NET_SCH_NETEM is not set" /proc/config.gz 2>/dev/null &&
                why=": this kernel has no netem (CONFIG_NET_SCH_NETEM is not set)"
            die "--delay $delay: tc could not add a netem qdisc on $dev (tc: ${err//$'\n'/ })$why." \
                "--delay needs netem; run without --delay (links shaped to --bw, no added delay)"
        fi
    elif [ "$bw" != none ]; then
        # a burst of 1 ms at the rate, at least 64 KiB (one TSO segment)
        "${tcx[@]}" qdisc add dev "$dev" root tbf rate "$bw" burst "$burst" latency 5ms ||
            die "--bw $bw: tc could not add a tbf qdisc on $dev (expected a rate such as 1gbit or 500mbit)"
    fi
}

rate_bits() { # 10gbit -> 10000000000
    local v=${1,,} m=1
    case "$v" in
    *gbit) m=1000000000; v=${v%gbit} ;; *mbit) m=1000000; v=${v%mbit} ;;
    *kbit) m=1000; v=${v%kbit} ;; *bit) v=${v%bit} ;;
    *) return 1 ;;
    esac
    [[ "$v" =~ ^[0-9]+$ ]] || return 1
    echo $((v * m))
}

do_up() {
    if [ -f "$state/hosts" ]; then
        [ "$(cat "$state/hosts")" = "$hosts" ] ||
            die "up: a cluster '$prefix' with $(cat "$state/hosts") hosts is already up (run: $0 down --prefix $prefix)"
        echo "$state/hostfile"
        return
    fi
    if [ "$bw" != none ]; then
        local bits
        bits=$(rate_bits "$bw") || die "--bw '$bw': expected a rate such as 10gbit, 500mbit or none"
        burst=$((bits / 8 / 1000))
        [ "$burst" -lt 65536 ] && burst=65536
    fi
    local quota=
    if [ -n "$cpus" ]; then
        [[ "$cpus" =~ ^[0-9]+(\.[0-9]+)?$ ]] && quota=$(awk -v c="$cpus" 'BEGIN { printf "%d", c * 100000 }') &&
            [ "$quota" -ge 1000 ] || die "--cpus '$cpus': expected a number of cores such as 0.5 or 2"
        [ -w "$cpuroot" ] || die "--cpus: no writable cpu cgroup at $cpuroot"
    fi
    ip link show "$bridge" >/dev/null 2>&1 && die "up: a bridge $bridge exists but no cluster state in $state (run: $0 down --prefix $prefix)"
    if ip -4 addr show | grep -q " inet $subnet\."; then
        die "--subnet $subnet: addresses of $subnet.0/24 are already used on this machine"
    fi
    # any failure from here on (a command under set -e, die) exits: undo all
    trap 'rc=$?; if [ $rc -ne 0 ]; then echo "cluster.sh: up failed; removing what it made" >&2; do_down; fi' EXIT
    trap 'exit 130' INT TERM
    mkdir -p "$state/uts"
    ip link add "$bridge" type bridge
    ip addr add "$subnet.254/24" dev "$bridge"
    ip link set "$bridge" up
    local slots
    slots=$(nproc)
    : >"$state/hostfile"
    for ((i = 0; i < hosts; i++)); do
        local ns
        ns=$(host_name "$i")
        ip netns add "$ns"
        ip link add "${prefix}v$i" type veth peer name eth0 netns "$ns"
        ip link set "${prefix}v$i" master "$bridge" up
        ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        ip -n "$ns" route add default via "$subnet.254"
        shape "${prefix}v$i"      # into the host
        shape eth0 "$ns"          # out of the host
        # a UTS namespace, kept alive by a bind mount, with the host's name
        : >"$state/uts/$ns"
        unshare --uts="$state/uts/$ns" hostname "$ns"
        if [ -n "$quota" ]; then
            local cg
            cg=$(host_cg "$i")
            mkdir -p "$cg"
            if [ "$cpuroot" = /sys/fs/cgroup ]; then echo "$quota 100000" >"$cg/cpu.max"
            else echo 100000 >"$cg/cpu.cfs_period_us"; echo "$quota" >"$cg/cpu.cfs_quota_us"; fi
        fi
        echo "$ns slots=$slots" >>"$state/hostfile"
        echo "$subnet.$((i + 1)) $ns" >>"$state/addresses"
    done
    cat >"$state/rsh" <<EOF
#!/bin/sh
# mpirun's rsh agent for the pretend cluster '$prefix' (scripts/cluster.sh)
exec "$(cd "$(dirname "$0")" && pwd)/$(basename "$0")" rsh --prefix $prefix "\$@"
EOF
    chmod +x "$state/rsh"
    echo "--hostfile $state/hostfile --mca plm_rsh_agent $state/rsh" \
         "--mca oob_tcp_if_include $subnet.0/24 --mca btl_tcp_if_include $subnet.0/24" \
         "--mca btl self,vader,tcp" >"$state/mpirun.args"
    echo "bw=$bw delay=${delay:-none} cpus=${cpus:-all} subnet=$subnet.0/24 bridge=$bridge" >"$state/links"
    echo "$hosts" >"$state/hosts"
    trap - EXIT INT TERM
    echo "cluster '$prefix': $hosts hosts on $bridge ($subnet.0/24), links ${bw} ${delay:+delay $delay}${cpus:+, $cpus cores each}"
    echo "mpirun options: $(cat "$state/mpirun.args")"
    echo "$state/hostfile"
}

# rsh HOST CMD...: what mpirun runs instead of ssh. Options before the host
# (ssh's -x and the like) are ignored; the command runs in the host's
# network and UTS namespaces, in a shell, as ssh would run it.
do_rsh() {
    while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
    [ $# -ge 2 ] || die "rsh: expected HOST COMMAND..."
    local host=$1; shift
    [[ "$host" =~ ^$prefix-h[0-9]+$ ]] && [ -e "$state/uts/$host" ] ||
        die "rsh: '$host' is not a host of cluster '$prefix' (hosts: $(awk '{print $1}' "$state/hostfile" 2>/dev/null | tr '\n' ' '))"
    local cg
    cg=$(host_cg "${host#"$prefix"-h}")
    if [ -d "$cg" ]; then echo $$ >"$cg/cgroup.procs"; fi  # the host's cores, for all it starts
    exec nsenter --net="/run/netns/$host" --uts="$state/uts/$host" -- /bin/sh -c "$*"
}

do_status() {
    if [ ! -f "$state/hosts" ]; then
        echo "cluster '$prefix': down"
        return 0
    fi
    local n
    n=$(cat "$state/hosts")
    echo "cluster '$prefix': $n hosts, $(cat "$state/links")"
    for ((i = 0; i < n; i++)); do
        local ns addr procs tx rx
        ns=$(host_name "$i")
        addr=$(ip -n "$ns" -4 -o addr show dev eth0 2>/dev/null | awk '{print $4}')
        procs=$(host_pids "$i" | wc -l)
        tx=$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes 2>/dev/null || echo "?")
        rx=$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/rx_bytes 2>/dev/null || echo "?")
        echo "  $ns  ${addr:-no address}  hostname $(nsenter --uts="$state/uts/$ns" hostname 2>/dev/null || echo '?')  processes $procs  tx $tx B  rx $rx B"
    done
    echo "hostfile: $state/hostfile"
}

case "$cmd" in
up) need_root; do_up ;;
down) need_root; do_down; echo "cluster '$prefix': down" ;;
status) do_status ;;
args) [ -f "$state/mpirun.args" ] || die "args: cluster '$prefix' is not up"; cat "$state/mpirun.args" ;;
rsh) do_rsh "${rest[@]}" ;;
mpirun)
    [ -f "$state/mpirun.args" ] || die "mpirun: cluster '$prefix' is not up (run: $0 up H)"
    # shellcheck disable=SC2046
    exec mpirun $(cat "$state/mpirun.args") "${rest[@]}" ;;
*) die "unknown command '$cmd' (expected up, down, status, args, mpirun)" ;;
esac
