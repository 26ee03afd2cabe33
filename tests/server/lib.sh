# lib.sh — the common set-up of the shell server tests (sourced, after `set -u`): KILN / PY / SHARED
# defaults, skip (77) without curl, a scratch folder $T removed at exit together with the server
# whose pid is in $pid, fail MESSAGE (prints the tail of $T/log), and wait_listening LOG, which waits
# until the server logging to LOG listens and sets $url (status 1 when it never does).
KILN=${KILN:-./kiln}
PY=${PY:-/usr/bin/python3}
SHARED=${SHARED:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/shared}
command -v curl >/dev/null || { echo "curl not installed"; exit 77; }
T=$(mktemp -d)
pid=
trap 'rm -rf "$T"; [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null' EXIT
fail() { echo "FAIL: $*"; [ -f "$T/log" ] && tail -n 20 "$T/log"; exit 1; }
wait_listening() {
    for _ in $(seq 300); do grep -q "listening on" "$1" && break; sleep 0.1; done
    url=$(grep -o 'http://127.0.0.1:[0-9]*' "$1" | head -1)
    [ -n "$url" ]
}
