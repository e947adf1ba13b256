#!/bin/bash
# Our client over TLS (nbds://, nbds+unix://): `nbdflow copy` and `nbdflow
# info` against our server, qemu-nbd (tls-creds objects) and nbdkit
# (--tls=require), with X.509 and PSK, and anonymous TLS (tls-type=anon)
# against qemu-nbd, every copy verified byte for byte.
# What each copy negotiated: its --json names it (tls.source or
# .destination; the other side null), the same both ways, with the
# authentication that was used (psk, x509-verified, x509 when the server
# was not checked, anon in TLS 1.2); our server's --stats logs the same
# version and cipher for each of the copy's connections, over TCP and a
# Unix socket, with its own view of the authentication.
# Then the no-downgrade rule: an nbds URI never continues in clear, whether
# the server refuses STARTTLS, is oldstyle, or is newstyle without the
# fixed flag; bad credentials give a clear error; and TLS parameters in a
# plaintext nbd:// or nbd+unix:// URI are refused before connecting.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/tls-pki.inc"

tmpdir_make
pki_ca "$TMP/ca" "nbdflow test CA"
pki_ca "$TMP/ca2" "some other CA"
pki_dir "$TMP/ca" "$TMP/pki"
pki_dir "$TMP/ca2" "$TMP/foreign"
mkdir -p "$TMP/psk"
psk_make "$TMP/psk/keys.psk" alice
psk_make "$TMP/wrong.psk" alice
MIB=24
for i in 1 2 3 4 5 6 7 8 9; do make_random "$TMP/src$i.img" "$MIB"; done

# tls_of JSON SIDE: the "tls" of SIDE (source or destination) in the
# copy --json report in file JSON: "VERSION CIPHER AUTH UNIFORM", or null.
tls_of () {
    python3 - "$1" "$2" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["tls"][sys.argv[2]]
print("null" if t is None else
      "%s %s %s %s" % (t["version"], t["cipher"], t["auth"], t["uniform"]))
PY
}

# check_tls JSON SIDE AUTH: the report in file JSON names TLS with AUTH on
# SIDE, every connection alike, and none on the other side. Sets TLS_VC
# to "VERSION CIPHER".
check_tls () {
    local json=$1 side=$2 auth=$3 other=source got
    [ "$side" = source ] && other=destination
    got=$(tls_of "$json" "$side") || fail "no tls in $(cat "$json")"
    [ "$(tls_of "$json" "$other")" = null ] ||
        fail "TLS reported on the $other side: $(cat "$json")"
    [[ $got =~ ^TLS1\.[23]\ [A-Z0-9-]+\ $auth\ True$ ]] ||
        fail "the $side's TLS is '$got', expected $auth: $(cat "$json")"
    TLS_VC=${got% * *}
}

# copy_both N URI DSTFILE AUTH: uploads srcN to URI (whose export is
# DSTFILE), downloads it back, and compares both ways; both reports name
# TLS with AUTH, the same version and cipher (in TLS_VC).
copy_both () {
    local n=$1 uri=$2 dst=$3 auth=$4 up
    "$NBDFLOW" copy --json "$TMP/src$n.img" "$uri" >"$TMP/up.json" ||
        fail "nbdflow copy upload ($uri)"
    note "ok: nbdflow copy upload ($uri)"
    same "$TMP/src$n.img" "$dst"
    check_tls "$TMP/up.json" destination "$auth"
    up=$TLS_VC
    rm -f "$TMP/back.img"
    "$NBDFLOW" copy --json "$uri" "$TMP/back.img" >"$TMP/down.json" ||
        fail "nbdflow copy download ($uri)"
    note "ok: nbdflow copy download ($uri)"
    same "$TMP/src$n.img" "$TMP/back.img"
    check_tls "$TMP/down.json" source "$auth"
    [ "$TLS_VC" = "$up" ] ||
        fail "upload negotiated $up, download $TLS_VC ($uri)"
    note "ok: $TLS_VC, $auth, both ways"
}

# stats_tls N WANT: our server's --stats has logged, since the last call
# (or since STATS_SEEN was set), N lines "PEER: tls: WANT", one for each
# connection of the command that ran, and no other.
STATS_SEEN=0
stats_tls () {
    local n=$1 want=$2 got
    server_logged_tls () { [ "$(grep -c ': tls: ' "$SERVER_LOG")" -ge $((STATS_SEEN + n)) ]; }
    wait_for server_logged_tls
    got=$(grep ': tls: ' "$SERVER_LOG" | tail -n +$((STATS_SEEN + 1)))
    STATS_SEEN=$((STATS_SEEN + n))
    [ "$(grep -c . <<<"$got")" = "$n" ] && ! grep -vqF ": tls: $want" <<<"$got" ||
        fail "the server logged, for $n connections of '$want': $got"
    note "ok: the server logged $n x '$want'"
}

# ---- our server ----
truncate -s "${MIB}M" "$TMP/dst.img"
serve_tcp --tls=require --tls-certs "$TMP/pki" --tls-psk "$TMP/psk/keys.psk" "$TMP/dst.img"
out=$("$NBDFLOW" info "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/pki" 2>&1) ||
    fail "nbdflow info over X.509: $out"
grep -q "with TLS" <<<"$out" || fail "nbdflow info did not report TLS: $out"
out=$("$NBDFLOW" info --json "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/pki" 2>&1) ||
    fail "nbdflow info --json over X.509: $out"
grep -q '"TLS": true' <<<"$out" || fail "info --json did not report TLS: $out"
copy_both 1 "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/pki" "$TMP/dst.img" x509-verified
copy_both 2 "nbds://localhost:$PORT/?tls-certificates=$TMP/pki" "$TMP/dst.img" x509-verified
copy_both 3 "nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$TMP/psk/keys.psk" "$TMP/dst.img" psk
# Credentials load once per command, before the first connection, and
# every connection shares them: nbdflow info (one connection), info --list
# (a listing connection, then one for the export) and a copy over C
# connections open ca-cert.pem equally often. Counted under strace.
if can_strace; then
    X="nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/pki"
    traced -e trace=openat -o "$TMP/info.trace" "$NBDFLOW" info "$X" \
        >/dev/null || fail "info under strace"
    traced -e trace=openat -o "$TMP/list.trace" "$NBDFLOW" info --list "$X" \
        >/dev/null || fail "info --list under strace"
    traced -e trace=openat -o "$TMP/copy.trace" \
        "$NBDFLOW" copy --json "$TMP/src4.img" "$X" >"$TMP/loads.json" ||
        fail "copy under strace"
    same "$TMP/src4.img" "$TMP/dst.img"
    per_info=$(grep -c 'ca-cert.pem' "$TMP/info.trace" || true)
    per_list=$(grep -c 'ca-cert.pem' "$TMP/list.trace" || true)
    per_copy=$(grep -c 'ca-cert.pem' "$TMP/copy.trace" || true)
    conns=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["connections"]["destination"])' "$TMP/loads.json")
    [ "$per_info" -gt 0 ] || fail "info never opened ca-cert.pem"
    [ "$per_list" = "$per_info" ] ||
        fail "info --list opened ca-cert.pem $per_list times, info $per_info"
    [ "$conns" -gt 1 ] && [ "$per_copy" = "$per_info" ] ||
        fail "a copy over $conns connections opened ca-cert.pem" \
             "$per_copy times, info $per_info"
    note "ok: one credential load for 1, 2 and $conns connections"
else
    note "skipped the credential-load count: strace cannot trace here"
fi
check_fails "wrong PSK is refused" "$NBDFLOW" info \
    "nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$TMP/wrong.psk"
check_fails "server certificate from a foreign CA is refused" "$NBDFLOW" info \
    "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/foreign"
check_fails "certificate name mismatch is refused" "$NBDFLOW" info \
    "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/pki&tls-hostname=elsewhere.example"
check "tls-verify-peer=0 accepts a certificate it cannot verify" "$NBDFLOW" info \
    "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/foreign&tls-verify-peer=0"
# info_fails URI PATTERN: nbdflow info URI must fail with one line
# matching PATTERN (grep).
info_fails () {
    local rc=0
    "$NBDFLOW" info "$1" >"$TMP/out" 2>&1 || rc=$?
    [ "$rc" -ne 0 ] || fail "$1: exited 0"
    grep -q "$2" "$TMP/out" || fail "$1: $(cat "$TMP/out")"
    note "ok: $(cat "$TMP/out")"
}
# Anonymous TLS against a server with credentials: no common key exchange.
info_fails "nbds://127.0.0.1:$PORT/?tls-type=anon" \
    "TLS with the server failed: .*(does the server offer anonymous TLS?)"
# TLS parameters that contradict each other are refused before connecting
# (nothing listens on this port: the error must be about the URI).
nport=$(free_port)
for q in "tls-type=anon&tls-verify-peer=1" "tls-type=anon&tls-certificates=$TMP/pki" \
         "tls-type=anon&tls-hostname=localhost" "tls-type=psk" "tls-type=kerberos" \
         "tls-type=x509&tls-psk-file=$TMP/psk/keys.psk"; do
    info_fails "nbds://127.0.0.1:$nport/?$q" \
        "tls-type=anon authenticates no one: drop tls-\|tls-type=psk needs tls-psk-file\|tls-type=kerberos is not supported\|tls-type=x509 checks certificates: drop tls-psk-file"
done
# TLS parameters in a plaintext URI are refused, not ignored: the image
# would cross in the clear while the user believed it encrypted.
for u in "nbd://alice@127.0.0.1:$nport/?tls-psk-file=$TMP/psk/keys.psk" \
         "nbd+unix:///?socket=$TMP/none.sock&tls-certificates=$TMP/pki" \
         "nbd://127.0.0.1:$nport/?tls-verify-peer=1"; do
    info_fails "$u" "in an nbd\(+unix\)\?:// URI, which never uses TLS: use nbds\(+unix\)\?:// to encrypt"
done
rc=0
"$NBDFLOW" copy "$TMP/src4.img" \
    "nbd://127.0.0.1:$nport/?tls-type=x509&tls-certificates=$TMP/pki" \
    >"$TMP/out" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "tls-type in an nbd:// URI" "$TMP/out" ||
    fail "copy to a plaintext URI with TLS parameters: $rc $(cat "$TMP/out")"
note "ok: $(cat "$TMP/out")"
# Credentials load before connecting: our own mistake is named as such
# even with nothing listening, and no server sees a handshake cut short.
info_fails "nbds://bob@127.0.0.1:$nport/?tls-psk-file=$TMP/psk/keys.psk" \
    'TLS credentials: PSK file .* has no key for user "bob"'
mkdir -p "$TMP/nokey"
cp "$TMP/pki/ca-cert.pem" "$TMP/pki/client-cert.pem" "$TMP/nokey/"
info_fails "nbds://127.0.0.1:$nport/?tls-certificates=$TMP/nokey" \
    "TLS credentials: cannot read $TMP/nokey/client-key.pem: No such file"
server_alive || fail "server died"
serve_stop

# Both ends name the same session: the copy in its --json, our server
# with --stats for each of the copy's two connections (-C 2). The server
# checks no client certificate (x509) and knows the PSK client's user.
serve_tcp --stats --tls=require --tls-certs "$TMP/pki" \
    --tls-psk "$TMP/psk/keys.psk" "$TMP/dst.img"
U="nbds://alice@127.0.0.1:$PORT/?tls-psk-file=$TMP/psk/keys.psk"
"$NBDFLOW" copy --json -C 2 "$TMP/src2.img" "$U" >"$TMP/c2.json" ||
    fail "copy -C 2 over PSK"
note "ok: copy -C 2 over PSK"
same "$TMP/src2.img" "$TMP/dst.img"
check_tls "$TMP/c2.json" destination psk
stats_tls 2 "$TLS_VC, psk user \"alice\""
U="nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/foreign&tls-verify-peer=0"
rm -f "$TMP/back.img"
"$NBDFLOW" copy --json -C 2 "$U" "$TMP/back.img" >"$TMP/c2.json" ||
    fail "copy -C 2, the server's certificate unchecked"
note "ok: copy -C 2, the server's certificate unchecked"
same "$TMP/src2.img" "$TMP/back.img"
check_tls "$TMP/c2.json" source x509
stats_tls 2 "$TLS_VC, x509"
serve_stop

# A certificate the CA issued to a client cannot pose as a server's, even
# where no host name is checked (a Unix socket without tls-hostname).
mkdir -p "$TMP/imposter"
cp "$TMP/pki/ca-cert.pem" "$TMP/imposter/"
cp "$TMP/pki/client-cert.pem" "$TMP/imposter/server-cert.pem"
cp "$TMP/pki/client-key.pem" "$TMP/imposter/server-key.pem"
SOCK=$TMP/imposter.sock
serve_start --unix "$SOCK" --tls=require --tls-certs "$TMP/imposter" "$TMP/dst.img"
info_fails "nbds+unix:///?socket=$SOCK&tls-certificates=$TMP/pki" \
    "does not match the intended purpose"
serve_stop
serve_start --unix "$SOCK" --stats --tls=require --tls-certs "$TMP/pki" "$TMP/dst.img"
out=$("$NBDFLOW" info "nbds+unix:///?socket=$SOCK&tls-certificates=$TMP/pki" 2>&1) ||
    fail "a server certificate over a Unix socket: $out"
STATS_SEEN=0
stats_tls 1 "$TLS_VC, x509" # the version and cipher of the copies above
serve_stop
note "ok: a client's certificate is refused as a server's"

# A server that asks for a client certificate and gets none refuses it
# with a TLS alert; under TLS 1.3 that alert arrives after our side of
# the handshake is over, and the error names it instead of "Protocol error".
mkdir -p "$TMP/caonly"
cp "$TMP/pki/ca-cert.pem" "$TMP/caonly/"
serve_tcp --stats --tls=require --tls-certs "$TMP/pki" --tls-verify-peer "$TMP/dst.img"
info_fails "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/caonly" \
    "the server ended the TLS session with a fatal alert: Certificate is required"
rc=0
"$NBDFLOW" copy "$TMP/src4.img" "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/caonly" \
    >"$TMP/out" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "fatal alert: Certificate is required" "$TMP/out" ||
    fail "copy without a client certificate (rc $rc): $(cat "$TMP/out")"
info_ok=$("$NBDFLOW" info "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/pki" 2>&1) ||
    fail "with its certificate the client was refused: $info_ok"
STATS_SEEN=0 # the refused ones never finished their handshake
stats_tls 1 "$TLS_VC, x509-verified"
serve_stop
note "ok: a refused client certificate is named as the server's alert"

# ---- peers ----
if command -v qemu-nbd >/dev/null 2>&1; then
    for kind in x509 psk anon; do
        truncate -s "${MIB}M" "$TMP/q.img"
        if [ $kind = x509 ]; then
            obj="tls-creds-x509,id=tls0,endpoint=server,dir=$TMP/pki"
            n=4 q="?tls-certificates=$TMP/pki" user=
        elif [ $kind = anon ]; then
            obj="tls-creds-anon,id=tls0,endpoint=server"
            n=9 q="?tls-type=anon" user=
        else
            obj="tls-creds-psk,id=tls0,endpoint=server,dir=$TMP/psk"
            n=5 q="?tls-psk-file=$TMP/psk/keys.psk" user=alice@
        fi
        qport=$(free_port)
        qemu-nbd -f raw -b 127.0.0.1 -p "$qport" --shared=8 --persistent \
            --object "$obj" --tls-creds tls0 "$TMP/q.img" 2>"$TMP/qemu-nbd.log" &
        qpid=$!
        SERVER_PIDS+=("$qpid")
        for ((i = 0; i < 100; i++)); do
            "$NBDFLOW" info "nbds://${user}127.0.0.1:$qport/$q" >"$TMP/out" 2>&1 && break
            sleep 0.1
        done
        grep -q "with TLS" "$TMP/out" || fail "qemu-nbd, $kind: $(cat "$TMP/out")"
        auth=$kind
        [ $kind = x509 ] && auth=x509-verified
        copy_both $n "nbds://${user}127.0.0.1:$qport/$q" "$TMP/q.img" $auth
        # Anonymous key exchange exists in TLS 1.2 only.
        [ $kind != anon ] || [ "${TLS_VC%% *}" = TLS1.2 ] ||
            fail "anonymous TLS reported as $TLS_VC"
        kill "$qpid"; wait "$qpid" 2>/dev/null
    done
else
    note "SKIPPED PART: qemu-nbd not installed (Debian package: qemu-utils)"
fi
if command -v nbdkit >/dev/null 2>&1; then
    for kind in x509 psk; do
        truncate -s "${MIB}M" "$TMP/k.img"
        if [ $kind = x509 ]; then
            targ="--tls-certificates=$TMP/pki"
            n=6 q="?tls-certificates=$TMP/pki" user=
        else
            targ="--tls-psk=$TMP/psk/keys.psk"
            n=7 q="?tls-psk-file=$TMP/psk/keys.psk" user=alice@
        fi
        kport=$(free_port)
        nbdkit -f -i 127.0.0.1 -p "$kport" --tls=require "$targ" \
            -P "$TMP/nbdkit.pid" file "$TMP/k.img" 2>"$TMP/nbdkit.log" &
        kpid=$!
        SERVER_PIDS+=("$kpid")
        for ((i = 0; i < 100; i++)); do [ -s "$TMP/nbdkit.pid" ] && break; sleep 0.1; done
        auth=$kind
        [ $kind = x509 ] && auth=x509-verified
        copy_both $n "nbds://${user}127.0.0.1:$kport/$q" "$TMP/k.img" $auth
        # The unix flavour of the URI, too.
        kill "$kpid"; wait "$kpid" 2>/dev/null; rm -f "$TMP/nbdkit.pid"
    done
    sock=$TMP/k.sock
    nbdkit -f -U "$sock" --tls=require --tls-psk="$TMP/psk/keys.psk" \
        -P "$TMP/nbdkit.pid" file "$TMP/k.img" 2>"$TMP/nbdkit.log" &
    kpid=$!
    SERVER_PIDS+=("$kpid")
    for ((i = 0; i < 100; i++)); do [ -s "$TMP/nbdkit.pid" ] && break; sleep 0.1; done
    copy_both 8 "nbds+unix://alice@/?socket=$sock&tls-psk-file=$TMP/psk/keys.psk" "$TMP/k.img" psk
    kill "$kpid"; wait "$kpid" 2>/dev/null; rm -f "$TMP/nbdkit.pid"
else
    note "SKIPPED PART: nbdkit not installed (Debian package: nbdkit)"
fi

# ---- no downgrade ----
# A plaintext server of ours answers STARTTLS with ERR_POLICY.
serve_tcp "$TMP/dst.img"
if "$NBDFLOW" info "nbds://127.0.0.1:$PORT/?tls-certificates=$TMP/pki" >"$TMP/out" 2>&1; then
    fail "nbds against a server without TLS succeeded: $(cat "$TMP/out")"
fi
grep -q "never continues in clear" "$TMP/out" || fail "unclear error: $(cat "$TMP/out")"
note "ok: STARTTLS refused -> $(cat "$TMP/out")"
serve_stop

# Fake servers that record everything the client sends after its flags:
# nothing but STARTTLS may ever arrive in clear.
for fake in refuse unsup oldstyle unfixed; do
    fport=$(free_port)
    python3 - "$fport" "$fake" "$TMP/fake.$fake" <<'PY' &
import socket, struct, sys
port, kind, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", port))
ls.listen(1)
open(out + ".ready", "w").close()
ls.settimeout(30)
s, _ = ls.accept()
s.settimeout(10)
got = b""
try:
    if kind == "oldstyle":
        s.sendall(b"NBDMAGIC" + struct.pack(">QQI", 0x00420281861253,
                                            1 << 20, 1) + bytes(124))
    else:
        flags = 0 if kind == "unfixed" else 1
        s.sendall(b"NBDMAGIC" + b"IHAVEOPT" + struct.pack(">H", flags))
        got += s.recv(4, socket.MSG_WAITALL)
        if kind in ("refuse", "unsup"):
            hdr = s.recv(16, socket.MSG_WAITALL)
            got += hdr
            _, opt, ln = struct.unpack(">QII", hdr)
            err = (1 << 31) | (2 if kind == "refuse" else 1)
            s.sendall(struct.pack(">QIII", 0x3e889045565a9, opt, err, 0))
    while True:
        b = s.recv(4096)
        if not b:
            break
        got += b
except OSError:
    pass
open(out, "wb").write(got)
PY
    fpid=$!
    for ((i = 0; i < 100; i++)); do [ -e "$TMP/fake.$fake.ready" ] && break; sleep 0.1; done
    if timeout 30 "$NBDFLOW" info "nbds://127.0.0.1:$fport/?tls-certificates=$TMP/pki" >"$TMP/out" 2>&1; then
        fail "nbds URI continued with a '$fake' server: $(cat "$TMP/out")"
    fi
    wait "$fpid"
    python3 - "$TMP/fake.$fake" "$fake" <<'PY' || fail "client sent options in clear to the '$fake' server"
import struct, sys
got = open(sys.argv[1], "rb").read()
kind = sys.argv[2]
if kind == "oldstyle":
    ok = len(got) == 0
else:
    rest = got[4:]
    # At most the STARTTLS option (opt 5, no data); then nothing but
    # NBD_OPT_ABORT, which carries no secrets.
    ok = True
    while rest:
        if len(rest) < 16:
            ok = False; break
        _, opt, ln = struct.unpack(">QII", rest[:16])
        if opt not in (5, 2) or ln:
            ok = False; break
        rest = rest[16:]
print("client sent %d bytes after the greeting" % len(got))
sys.exit(0 if ok else 1)
PY
    note "ok: no downgrade with a '$fake' server: $(tail -n 1 "$TMP/out")"
done
echo "PASS: our client over TLS with our server, qemu-nbd and nbdkit; no downgrade"
