"""Where the engine's work runs: the inference thread and the hand-off to it
(model_thread), the loop thread's main greenlet that torch may run on (main_lane), the
event loop's CPU priority (priority), process and container memory (memory), and the
codec, session and hook threads a worker's models share (pools).

May import: core/, codecs/ and the base modules; no other part of the engine.
"""
