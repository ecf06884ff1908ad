#!/usr/bin/env python3
"""Replays the client commands of a MONITOR trace (recorded by `scripts/callgrind-redis`) into the
Redis server on 127.0.0.1:PORT, one at a time, with LIBRARY's source in place of the function
library the trace loaded; prints each marked part's number of calls and a hash of its replies
(equal hashes, equal behaviour on this trace). Used by `scripts/callgrind-redis` and
`scripts/lua-lines-redis`.

    scripts/redis-replay.py TRACE LIBRARY PORT [CALLGRIND_PID]
"""
import hashlib, re, socket, subprocess, sys

trace, library, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
# A callgrind run's pid: its counters are zeroed at the first mark and dumped at each next one.
pid = sys.argv[4] if len(sys.argv) > 4 else None
source = open(library, 'rb').read()
ESCAPES = {'n': b'\n', 'r': b'\r', 't': b'\t', 'a': b'\a', 'b': b'\b', '"': b'"', '\\': b'\\'}

def words(rest):
    """The arguments of a MONITOR line, unquoted."""
    out, i = [], 0
    while i < len(rest):
        if rest[i] == ' ':
            i += 1
            continue
        i, word = i + 1, bytearray()
        while rest[i] != '"':
            if rest[i] == '\\' and rest[i + 1] == 'x':
                word.append(int(rest[i + 2:i + 4], 16))
                i += 4
            elif rest[i] == '\\':
                word += ESCAPES[rest[i + 1]]
                i += 2
            else:
                word += rest[i].encode()
                i += 1
        out.append(bytes(word))
        i += 1
    return out

sock = socket.create_connection(('127.0.0.1', port))
replies = sock.makefile('rb')

def reply():
    line = replies.readline()
    if line[:1] == b'$' and int(line[1:]) >= 0:
        return line + replies.read(int(line[1:]) + 2)
    if line[:1] == b'*':
        return line + b''.join(reply() for _ in range(max(int(line[1:]), 0)))
    return line

part, hashes, counts = None, {}, {}
for line in open(trace, encoding='utf-8', errors='surrogateescape'):
    m = re.match(r'^[\d.]+ \[\d+ ([^\]]+)\] (.*)$', line.rstrip('\n'))
    if not m or m.group(1) == 'lua':
        continue
    args = words(m.group(2))
    name = args[0].upper()
    if name == b'ECHO' and args[1].startswith(b'MARK-'):
        if pid:
            subprocess.run(['callgrind_control', '-d' if part else '-z', pid], check=True, capture_output=True)
        part = args[1][5:].decode()
        continue
    if name in (b'MONITOR', b'CLIENT', b'HELLO', b'PING', b'INFO', b'CONFIG'):
        continue
    if name == b'FUNCTION' and args[1].upper() == b'LOAD':
        recorded = re.match(rb'#!lua name=(\S+)', args[-1]).group(1)
        args[-1] = source.replace(b'__LIB__', recorded)
    sock.sendall(b'*%d\r\n' % len(args) + b''.join(b'$%d\r\n%s\r\n' % (len(a), a) for a in args))
    r = reply()
    if r.startswith(b'-'):
        sys.exit(f'{library}: {r[:200]!r}')
    if part:
        hashes.setdefault(part, hashlib.sha256()).update(r)
        counts[part] = counts.get(part, 0) + 1
for p in ('keyless', 'keyed'):
    print(f'{p}: {counts.get(p, 0)} calls, replies {hashes[p].hexdigest()[:16]}' if p in hashes else f'{p}: none')
