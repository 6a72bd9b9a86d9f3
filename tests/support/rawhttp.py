"""Raw HTTP/1.1 over loopback sockets for the scripted tests: what no HTTP library would send."""
import asyncio
import json
import re
import socket
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, raw, timeout=2.0):
    """Sends raw bytes; returns (status, headers text, body) of the answer, or (0, '', '')."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(raw)
            data = b""
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
                head, sep, body = data.partition(b"\r\n\r\n")
                if sep:
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    if len(body) >= length:
                        break
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1 ") else 0
        return status, head.decode("latin-1"), body
    except OSError:
        return 0, "", b""


def get(port, path, timeout=2.0):
    return request(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), timeout)


def post(port, path, body, timeout=2.0, content_type="application/json"):
    return request(port, (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n").encode() + body, timeout)


def ping_within(port, seconds=2.0):
    start = time.monotonic()
    status, _, _ = get(port, "/ping", timeout=seconds)
    return status == 200 and time.monotonic() - start < seconds


def error_code(body):
    try:
        return json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


async def exchange(port, raw, timeout=10.0):
    """(status, body, seconds) of one request on a new connection, with asyncio (for many clients
    at once); raises asyncio.TimeoutError past `timeout` for each step."""
    started = time.monotonic()
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    writer.write(raw)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
    body = await asyncio.wait_for(reader.readexactly(length), timeout)
    writer.close()
    return int(head.split()[1]), body, time.monotonic() - started
