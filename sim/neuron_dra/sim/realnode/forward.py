"""A node's only ways in and out of its network namespace, which has a loopback and nothing
else (no bridge, no route): TCP connections relayed between the host's loopback and the
node's, as kind's node containers would be reached through their network.

    python -m neuron_dra.sim.realnode.forward --netns /proc/<pid>/ns/net \\
        --in 127.0.0.1:<kubelet port> \\
        --out 127.0.0.1:<API port>=127.0.0.1:<API port> --out 10.96.0.1:443=127.0.0.1:<API port>

``--in ADDR``: the host's ADDR relayed to the node's same ADDR (the API server reaching the
kubelet for logs and exec). ``--out NODE=HOST``: the node's NODE relayed to the host's HOST
(kubelets, plugins and pods reaching the API server, by the kubeconfig's address or by the
``kubernetes`` Service's ClusterIP as kube-proxy would make it reachable). Prints ``ready``
once every listener is bound. Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
from collections.abc import Callable

from .netns import socket_in

Endpoint = tuple[str, int]


def parse_endpoint(text: str) -> Endpoint:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: want HOST:PORT")
    return host, int(port)


def parse_out(text: str) -> tuple[Endpoint, Endpoint]:
    node, sep, host = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: want NODE_HOST:PORT=HOST_HOST:PORT")
    return parse_endpoint(node), parse_endpoint(host)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.transport.abort()


async def _relay(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    make_socket: Callable[[], socket.socket],
    target: Endpoint,
) -> None:
    loop = asyncio.get_running_loop()
    sock = make_socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, target)
    except OSError:
        sock.close()
        client_w.transport.abort()
        return
    up_r, up_w = await asyncio.open_connection(sock=sock)
    try:
        await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
    finally:
        for w in (up_w, client_w):
            w.close()
            with contextlib.suppress(OSError):
                await w.wait_closed()


def _listener(make_socket: Callable[[], socket.socket], addr: Endpoint) -> socket.socket:
    sock = make_socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve(netns: str, ins: list[Endpoint], outs: list[tuple[Endpoint, Endpoint]]) -> None:
    def host_socket() -> socket.socket:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)

    def node_socket() -> socket.socket:
        return socket_in(netns)

    servers = []
    for addr in ins:

        async def to_node(
            r: asyncio.StreamReader, w: asyncio.StreamWriter, a: Endpoint = addr
        ) -> None:
            await _relay(r, w, node_socket, a)

        servers.append(await asyncio.start_server(to_node, sock=_listener(host_socket, addr)))
    for node_addr, host_addr in outs:

        async def to_host(
            r: asyncio.StreamReader, w: asyncio.StreamWriter, a: Endpoint = host_addr
        ) -> None:
            await _relay(r, w, host_socket, a)

        servers.append(await asyncio.start_server(to_host, sock=_listener(node_socket, node_addr)))
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--netns", required=True, help="/proc/<pid>/ns/net of the node")
    ap.add_argument("--in", dest="ins", type=parse_endpoint, action="append", default=[])
    ap.add_argument("--out", dest="outs", type=parse_out, action="append", default=[])
    args = ap.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.netns, args.ins, args.outs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
