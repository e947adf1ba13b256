#!/bin/bash
# netns-down.sh: stops whatever runs inside the link emulator's namespaces
# (the emulator itself, test servers) and deletes the namespaces, which
# removes their TUN devices too.
#
#   netns-down.sh [--ns-a NAME] [--ns-b NAME]
#
# Only namespaces whose names start with "nbdflow-" are touched; missing
# ones are fine. Exit: 0 done, 1 a namespace could not be deleted,
# 2 usage, 77 not root.
set -u

ns_a=nbdflow-a ns_b=nbdflow-b
while [ $# -gt 0 ]; do
    case $1 in
        --ns-a) ns_a=${2:?}; shift 2 ;;
        --ns-b) ns_b=${2:?}; shift 2 ;;
        *) echo "netns-down.sh: unknown argument \"$1\"" >&2; exit 2 ;;
    esac
done
if [ "$(id -u)" != 0 ]; then
    echo "netns-down.sh: needs root to delete network namespaces" >&2
    exit 77
fi

rc=0
for ns in "$ns_a" "$ns_b"; do
    case $ns in
        nbdflow-?*) ;;
        *) echo "netns-down.sh: namespace \"$ns\" refused: names must start with nbdflow-" >&2; exit 2 ;;
    esac
    ip netns list | grep -qw -- "^$ns" || continue
    # Processes inside our namespace were started by our scripts: stop
    # them by PID, politely first.
    pids=$(ip netns pids "$ns" 2>/dev/null)
    if [ -n "$pids" ]; then
        kill -TERM $pids 2>/dev/null
        for ((t = 0; t < 30; t++)); do
            alive=
            for p in $pids; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
            [ -z "$alive" ] && break
            sleep 0.1
        done
        [ -n "$alive" ] && kill -KILL $alive 2>/dev/null
    fi
    if ! ip netns del "$ns"; then
        echo "netns-down.sh: cannot delete namespace $ns" >&2
        rc=1
    fi
done
exit $rc
