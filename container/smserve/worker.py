"""gunicorn's gevent worker, with the two changes serving a model needs.

Used through `worker_class` in gunicorn_conf.py.
"""

import os
import socket

from gevent import monkey
from gevent import socket as gevent_socket
from gunicorn.workers.ggevent import GeventWorker


class GeventModelWorker(GeventWorker):
    def patch(self):
        # gevent's subprocess works only on the thread that runs gevent's loop, but the
        # model is imported, loaded and run on the inference thread, and CUDA builds of
        # torch start a process on import there (cuda.pathfinder -> ctypes.util.
        # find_library -> ldconfig), as triton does when it compiles. The standard
        # subprocess blocks only the thread that calls it.
        monkey.patch_all(subprocess=False)
        self.sockets = [
            gevent_socket.socket(s.FAMILY, socket.SOCK_STREAM, fileno=s.sock.detach()) for s in self.sockets
        ]

    def init_process(self):
        # Connections waiting for their next (or first) request.
        self.idle_connections = set()
        super().init_process()

    def handle_request(self, listener_name, req, sock, addr):
        self.idle_connections.discard(sock)
        handled = super().handle_request(listener_name, req, sock, addr)
        if not self.alive:
            # Shutting down: the connection ends with the request it carried. gunicorn
            # only sends Connection: close on requests that begin after SIGTERM.
            raise StopIteration()
        self.idle_connections.add(sock)
        return handled

    def handle(self, listener, client, addr):
        # Idle until its first request too: a client may connect and send nothing.
        self.idle_connections.add(client)
        try:
            super().handle(listener, client, addr)
        finally:
            self.idle_connections.discard(client)

    def handle_exit(self, sig, frame):
        super().handle_exit(sig, frame)
        # A load balancer keeps its connections alive; an idle one would hold this
        # worker until graceful_timeout, and then the arbiter kills it. Close idle
        # connections now, as any server may. Shutting down a duplicate descriptor makes
        # the kernel end the waiting read with end-of-file, so gunicorn closes the
        # connection as if the client had (gevent's own shutdown() would cancel the read
        # with EBADF, which gunicorn logs as an error).
        for sock in list(self.idle_connections):
            try:
                with socket.socket(fileno=os.dup(sock.fileno())) as duplicate:
                    duplicate.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
