"""Where the engine's work runs: the inference thread and the hand-off to it, and the
codec, session and hook threads a worker's models share (threads); the loop thread's
main greenlet that torch may run on, which forward passes may run there instead of on
the inference thread, and the event loop's CPU priority and poll clock (main_lane); and
process and container memory (memory).

May import: core/, codecs/ and the base modules; no other part of the engine.
"""
