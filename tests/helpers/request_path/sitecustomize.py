"""Put on a server's PYTHONPATH by tests/integration/test_request_path.py: records which of
the server package's modules run code for one request on a connection of its own, from
the worker's taking the connection (ExchangeWorker.handle) to the end of its
handle_request, and writes them to $REQUEST_PATH_OUT.<pid> after each
request. Python imports this module at start-up in every process the server runs, before
gunicorn forks its workers, so the profile function is every worker's too."""

import _thread
import os
import sys
import threading

_OUT = os.environ.get("REQUEST_PATH_OUT")

if _OUT:
    _state = {"on": False, "seen": set()}
    _MAIN = _thread.get_ident()

    def _current():
        greenlet = sys.modules.get("greenlet")
        return greenlet.getcurrent() if greenlet is not None else None

    def _for_the_request() -> bool:
        """Code run for the request: in its own greenlet, the main greenlet (the main lane,
        where an inline pass runs), the hub (which hands a thread's result back), or a
        thread of the worker's (the inference thread, the codec pool). Not the worker's
        other greenlets (its heartbeat, its idle sweep), which run whenever they are due,
        a slow request or not."""
        if _thread.get_ident() != _MAIN:
            return True
        current = _current()
        return current is _state["greenlet"] or current.parent is None or type(current).__name__ == "Hub"

    def _profile(frame, event, arg):
        if event != "call" and event != "return":
            return
        path = frame.f_code.co_filename
        if "/smserve/" not in path:
            return
        module = path.rsplit("/smserve/", 1)[1]
        if event == "call":
            if not _state["on"] and module == "http/exchange.py" and frame.f_code.co_name == "handle":
                _state["on"] = True
                _state["seen"] = set()
                _state["greenlet"] = _current()
            if _state["on"] and _for_the_request():
                _state["seen"].add(module + (":" + frame.f_code.co_name if os.environ.get("REQUEST_PATH_FUNCS") else ""))
        elif _state["on"] and module == "http/exchange.py" and frame.f_code.co_name == "handle_request":
            _state["on"] = False
            # Written aside, then renamed: the test may read it while the next request's
            # trace is being written, and must never see a file half written.
            final = f"{_OUT}.{os.getpid()}"
            with open(final + ".part", "w") as out:
                out.write("\n".join(sorted(_state["seen"])) + "\n")
            os.replace(final + ".part", final)

    def _profiled(start):
        def start_new_thread(function, args, kwargs=None):
            def run(*args, **kwargs):
                sys.setprofile(_profile)
                return function(*args, **kwargs)
            return start(run, args, kwargs or {})
        return start_new_thread

    # Threads started by _thread directly (the inference thread, gevent's pools) as well
    # as threading's: a pass run off the loop counts as the request's too.
    _thread.start_new_thread = _thread.start_new = _profiled(_thread.start_new_thread)
    sys.setprofile(_profile)
    threading.setprofile(_profile)
