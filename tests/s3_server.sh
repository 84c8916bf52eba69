#!/usr/bin/env bash
# A real S3 server on this machine for the tests: Ceph's RADOS Gateway
# (radosgw, Debian's package) on a one-node Ceph cluster made in a
# directory: a monitor, one OSD keeping its objects in memory (memstore,
# 4 GiB at most; S3_SERVER_STORE=bluestore: in a 16 GiB sparse file in DIR
# instead, for the benchmark's gigabytes), cephx off, every daemon on
# 127.0.0.1 at free ports. Deleted objects are collected at once (the
# gateway's default waits two hours). It checks SigV4
# signatures as AWS does (a wrong secret is refused), keeps multipart
# uploads, and can be stopped and started again while the cluster keeps
# its objects (the "server stopped mid-upload" faults).
#
#   tests/s3_server.sh start DIR   start everything; writes DIR/env (the
#                                  AWS_* variables to source) and prints it
#   tests/s3_server.sh stop-gw DIR kill the gateway (SIGKILL): the server is gone
#   tests/s3_server.sh start-gw DIR start the gateway again on the same port
#   tests/s3_server.sh mb DIR BUCKET  make a bucket (curl's SigV4)
#   tests/s3_server.sh stop DIR    stop everything (DIR is left to the caller)
#
# Exit 77 (with the reason) when radosgw or the Ceph daemons are not
# installed (scripts/install-deps.sh --test installs them), 1 when they are
# but do not come up (the daemons' logs are in DIR/log).
set -euo pipefail
cmd=${1:?usage: s3_server.sh start|stop|stop-gw|start-gw DIR}
dir=${2:?usage: s3_server.sh start|stop|stop-gw|start-gw DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf=$dir/ceph.conf
C=(-c "$conf")
as_root=()
[ "$(id -u)" -eq 0 ] && as_root=(--setuser root --setgroup root)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# Waits up to $1 seconds for command "${@:2}" to succeed.
wait_for() {
    local t=$1; shift
    local end=$((SECONDS + t))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.5
    done
}

start_gw() {
    local port; port=$(cat "$dir/gw_port")
    radosgw "${C[@]}" -n client.admin "${as_root[@]}" --rgw-frontends "beast endpoint=127.0.0.1:$port" \
        --rgw-data "$dir/rgw" --client-mount-timeout 30 -f >"$dir/log/radosgw.out" 2>&1 &
    echo $! >"$dir/gw.pid"
    wait_for 90 curl -sf -m 2 "http://127.0.0.1:$port/" || {
        echo "s3_server: radosgw did not answer on port $port within 90 s (see $dir/log)" >&2; return 1; }
}

stop_pid() {
    local f=$dir/$1.pid
    [ -f "$f" ] || return 0
    local p; p=$(cat "$f")
    kill "${2:--TERM}" "$p" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    rm -f "$f"
}

case $cmd in
start)
    for t in radosgw ceph-mon ceph-osd ceph monmaptool radosgw-admin; do
        command -v $t >/dev/null || {
            echo "SKIPPED: $t is not installed (Debian packages radosgw, ceph-mon, ceph-osd; scripts/install-deps.sh --test installs them)"
            exit 77; }
    done
    mkdir -p "$dir"/{mon,osd0,run,log,rgw}
    mon_port=$(free_port)
    free_port >"$dir/gw_port"
    fsid=$(cat /proc/sys/kernel/random/uuid)
    if [ "${S3_SERVER_STORE:-memstore}" = bluestore ]; then
        store=$(printf '%s\n' "osd objectstore = bluestore" "bluestore block create = true" \
            "bluestore block size = 17179869184" "bluestore block db create = false" "bluestore block wal create = false" \
            "osd memory target = 1073741824" "bluestore cache autotune = false" "bluestore cache size = 268435456")
    else
        store=$(printf '%s\n' "osd objectstore = memstore" "memstore device bytes = 4294967296")
    fi
    cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
ms mon client mode = crc
ms client mode = crc
ms bind ipv6 = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
mon max pg per osd = 1000
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 1
$store
rgw gc obj min wait = 0
rgw gc processor period = 10
rgw gc processor max time = 10
osd crush chooseleaf type = 0
run dir = $dir/run
log file = $dir/log/\$name.log
admin socket = $dir/run/\$name.asok
pid file = $dir/run/\$name.pid
mon data = $dir/mon
osd data = $dir/osd0
keyring = /dev/null
EOF
    monmaptool --create --addv a "[v2:127.0.0.1:$mon_port]" --fsid "$fsid" "$dir/monmap" >/dev/null
    ceph-mon "${C[@]}" --mkfs -i a --monmap "$dir/monmap" "${as_root[@]}"
    ceph-mon "${C[@]}" -i a "${as_root[@]}"
    cp "$dir/run/mon.a.pid" "$dir/mon.pid" 2>/dev/null || pgrep -n -f "ceph-mon -c $conf" >"$dir/mon.pid"
    wait_for 30 timeout 10 ceph "${C[@]}" health || { echo "s3_server: the monitor did not come up (see $dir/log)" >&2; exit 1; }
    timeout 30 ceph "${C[@]}" osd create >/dev/null
    ceph-osd "${C[@]}" -i 0 --mkfs "${as_root[@]}" >/dev/null 2>&1
    ceph-osd "${C[@]}" -i 0 "${as_root[@]}" >/dev/null 2>&1
    wait_for 30 test -f "$dir/run/osd.0.pid" && cp "$dir/run/osd.0.pid" "$dir/osd.pid"
    wait_for 60 sh -c "timeout 10 ceph -c '$conf' osd stat | grep -q '1 up'" || {
        echo "s3_server: the OSD did not come up (see $dir/log)" >&2; exit 1; }
    start_gw
    key=DTRAINTESTKEY$RANDOM
    secret=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
    timeout 60 radosgw-admin "${C[@]}" -n client.admin user create --uid=dtrain --display-name=dtrain \
        --access-key="$key" --secret-key="$secret" >/dev/null 2>"$dir/log/user.err"
    cat >"$dir/env" <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$(cat "$dir/gw_port")
export AWS_ACCESS_KEY_ID=$key
export AWS_SECRET_ACCESS_KEY=$secret
export AWS_REGION=us-east-1
EOF
    cat "$dir/env"
    ;;
mb)
    . "$dir/env"
    code=$(curl -s -o "$dir/log/mb.out" -w '%{http_code}' -m 30 --aws-sigv4 "aws:amz:$AWS_REGION:s3" \
        -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
        -X PUT "$AWS_ENDPOINT_URL/${3:?usage: s3_server.sh mb DIR BUCKET}")
    [ "$code" = 200 ] || { echo "s3_server: making bucket $3: HTTP $code $(cat "$dir/log/mb.out")" >&2; exit 1; }
    ;;
stop-gw) stop_pid gw -KILL ;;
start-gw) start_gw ;;
stop)
    stop_pid gw
    stop_pid osd
    stop_pid mon
    ;;
*) echo "usage: s3_server.sh start|stop|stop-gw|start-gw DIR" >&2; exit 2 ;;
esac
