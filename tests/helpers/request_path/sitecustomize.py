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
            if _state["on"]:
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
