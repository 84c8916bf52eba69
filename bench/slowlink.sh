#!/bin/sh
# Runs an MPI program over a slow link: two network namespaces ("hosts"),
# joined by a veth pair shaped with tc (a token bucket at RATE each way),
# RANKS ranks in each, started by mpirun in the first namespace; mpirun
# reaches the second through a plm_rsh_agent that enters it. Each namespace
# has its own host name (a UTS namespace), so Open MPI and dtrain see two
# hosts: ranks on one host share memory, the two hosts talk TCP over the
# shaped link. Needs root (ip netns, tc) and Open MPI's mpirun; everything
# it creates is removed when it exits.
#
#   bench/slowlink.sh [-r RATE] [-n RANKS] -- PROGRAM [ARGS]...
#     -r RATE   tc rate of each direction (default 1gbit)
#     -n RANKS  ranks per host (default 2)
#
# e.g. bench/slowlink.sh -r 1gbit -n 2 -- build/dtrain train configs/fashion-mlp.ini --set train.max_steps=50
set -eu
rate=1gbit ranks=2
while [ $# -gt 0 ]; do
    case "$1" in
    -r) rate=$2; shift 2 ;;
    -n) ranks=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "slowlink.sh: unknown option '$1' (expected -r RATE, -n RANKS, then -- PROGRAM ...)" >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || { echo "slowlink.sh: no program (give it after --)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "slowlink.sh: needs root for ip netns and tc" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "slowlink.sh: mpirun not found (scripts/install-deps.sh installs Open MPI)" >&2; exit 2; }

a=dtrain-slow-a-$$ b=dtrain-slow-b-$$ net=10.231.$(($$ % 250)) dir=$(mktemp -d)
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
ip netns add "$a"
ip netns add "$b"
ip link add vsa$$ netns "$a" type veth peer name vsb$$ netns "$b"
ip -n "$a" addr add "$net.1/24" dev vsa$$
ip -n "$b" addr add "$net.2/24" dev vsb$$
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set vsa$$ up
ip -n "$b" link set vsb$$ up
ip netns exec "$a" tc qdisc add dev vsa$$ root tbf rate "$rate" burst 256kb latency 50ms
ip netns exec "$b" tc qdisc add dev vsb$$ root tbf rate "$rate" burst 256kb latency 50ms

# mpirun's remote-shell agent: "agent [options] HOST COMMAND..."
cat > "$dir/agent" <<AGENT
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
[ "\$host" = "$net.2" ] && exec ip netns exec "$b" unshare -u sh -c "hostname dtrain-b; exec \$*"
exec sh -c "\$*"
AGENT
chmod +x "$dir/agent"

# The program's arguments, quoted for the shell that mpirun runs in.
args=""
for x in "$@"; do args="$args '$(printf '%s' "$x" | sed "s/'/'\\\\''/g")'"; done
ip netns exec "$a" unshare -u sh -c "hostname dtrain-a; exec mpirun --allow-run-as-root -np $((2 * ranks)) \
    --host $net.1:$ranks,$net.2:$ranks --mca plm_rsh_agent $dir/agent \
    --mca oob_tcp_if_include $net.0/24 --mca btl_tcp_if_include $net.0/24 $args"
