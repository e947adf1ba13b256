#!/bin/bash
# scripts/check-layers passes on src/ and fails, naming file, line and
# layer, on a copy of src/ where a layer includes a header of a layer
# above it or beside it (server and client), also through a relative
# path; a folder missing from src/layers.txt stops it too.
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || skip "no python3"
tmpdir_make
CHECK=$REPO_DIR/scripts/check-layers

"$CHECK" "$REPO_DIR/src" >"$TMP/out" 2>&1 || fail "src/: $(cat "$TMP/out")"
note "ok: src/ passes"

# refused FILE LINE WANT: with LINE added at the top of src/FILE, the check
# exits 1 and names src/FILE:1 and WANT (a fixed string).
refused () {
    local file=$1 line=$2 want=$3 rc=0
    rm -rf "$TMP/src"
    cp -r "$REPO_DIR/src" "$TMP/src"
    { echo "$line"; cat "$REPO_DIR/src/$file"; } >"$TMP/src/$file"
    "$CHECK" "$TMP/src" >"$TMP/out" 2>&1 || rc=$?
    [ "$rc" = 1 ] || fail "$file: $line: exit $rc, not 1: $(cat "$TMP/out")"
    grep -qF -- "src/$file:1: $want" "$TMP/out" ||
        fail "$file: $line: $(cat "$TMP/out")"
    note "ok: $(grep -F "src/$file:1:" "$TMP/out")"
}

refused server/export.c '#include "client/client.h"' \
    "server may not include client/client.h (layer client;"
refused client/http.c '#include "server/server.h"' \
    "client may not include server/server.h (layer server;"
refused util/size.c '#include "net/loop.h"' \
    "util may not include net/loop.h (layer net; util may include: nothing)"
refused proto/wire.c '#include "../format/image.h"' \
    "proto may not include format/image.h (layer format;"
refused net/sock.c '  #  include "copy/engine.h"' \
    "net may not include copy/engine.h (layer copy;"

# A folder the table does not name is an error of its own (exit 2).
rm -rf "$TMP/src"
cp -r "$REPO_DIR/src" "$TMP/src"
mkdir "$TMP/src/extra"
echo '#include "util/log.h"' >"$TMP/src/extra/x.c"
rc=0
"$CHECK" "$TMP/src" >"$TMP/out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -qF "folder extra is not in layers.txt" "$TMP/out" ||
    fail "unknown folder: exit $rc: $(cat "$TMP/out")"
note "ok: $(cat "$TMP/out")"

echo "PASS: the include check passes on src/ and refuses includes across layers"
