"""Child side of `grpo.rewards.sandbox` for assert tests: values out, where the solution cannot reach.

Three kinds of thread. The main thread sets up, starts the harness thread and
parks in a lock for good: it never runs Python code again, so no signal handler
can be installed (only the main thread may) and none ever sees a frame of ours.
The harness thread runs no submitted code and alone holds the run's nonce, the
key of the report's MAC. Each step (the solution, then each value a test needs)
runs on a fresh worker thread started from C, in effect as

    start_new_thread(deque, (map(queue.put, zip([step], map(eval, [code], [namespace]))), 0))

so no Python frame of the harness is on a worker's stack: walking up from any
frame of the solution ends at the step's own code, and the queue the value
travels on is referenced only from C and from the harness thread. The harness
thread takes the value off the queue, reads it into tagged JSON with primitives
bound before any submitted code ran (a built-in type is read through its C
methods, so an int subclass with a lying __eq__ reads as the int it stores),
and at the end writes the JSON signed with the nonce. The parent compares.

A step whose worker dies (an exception, SystemExit) delivers no value; the
harness thread waits for the worker's end (a lock released when its thread
state is deleted, or on Python 3.13+ the handle of a joinable thread). The
workers' `sys.unraisablehook` describes exceptions on a queue that the solution
can reach too, so it can only make the verdict worse (a MemoryError ends the
run with `MEMORY_EXIT`). Code of the solution's that still runs on the harness
thread (a finaliser or gc callback during a collection there) meets the audit
hook's trusted-thread rule: any audited event, a frame look-up first of all,
ends the run.

Imports only the standard library, like the rest of the child.
"""

import _json
import _queue
import _thread
import gc
import io
import os
import signal
import sys
import threading  # noqa: F401 - first imported here, so its _MainThread is this thread (see below)
import traceback
import types
from _blake2 import blake2b  # hashlib's blake2b, without loading OpenSSL (~10 ms a run)
from collections import deque
from functools import partial
from itertools import chain, starmap

MEMORY_EXIT = 87
_MAX_DEPTH = 100  # deeper values (or cycles) are not encoded: the test fails
_SET_SENTINEL = getattr(_thread, "_set_sentinel", None)  # Python <= 3.12
_START_JOINABLE = getattr(_thread, "start_joinable_thread", None)  # Python >= 3.13


def run(job, report_fd, install_hook):
    """Run the solution and the tests' steps, write the signed report, exit. Never returns."""
    exit = os._exit
    try:
        key = bytes.fromhex(job["nonce"])
        # The solution's namespace, and sys.modules["__main__"] instead of this harness.
        module = types.ModuleType("__main__")
        errors = _queue.SimpleQueue()  # (is MemoryError, description) from the workers: untrusted
        try:
            solution, failure = compile(job["code"], "<solution>", "exec"), None
        except (SyntaxError, ValueError) as error:
            solution, failure = None, _describe(error)
        tests = [[_compile_step(mode, source) for mode, source in steps] for steps in job["steps"]]
        serve = _make_server(key, report_fd, module.__dict__, errors)
        sys.stdin = io.StringIO("")
        sys.modules["__main__"] = module
        sys.unraisablehook = _make_error_reporter(errors)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # so _thread.interrupt_main() does nothing
        # The harness goes on on a thread of its own and this one parks: only the main thread
        # can install a signal handler, and a handler receives the main thread's current frame.
        parked = _thread.allocate_lock()
        parked.acquire()
        _thread.start_new_thread(_trusted, (serve, install_hook, solution, failure, tests))
        parked.acquire()  # forever: the harness thread ends the process
    finally:
        exit(1)  # never a normal interpreter exit: no atexit hooks, no finalisers of the solution's


def _trusted(serve, install_hook, *args, get_ident=_thread.get_ident, exit=os._exit):
    try:
        install_hook(trusted_thread=get_ident())
        serve(*args)
    finally:
        exit(1)


def _compile_step(mode, source):
    try:
        if mode == "exec":
            return mode, compile(source, "<test>", "exec")
        return mode, compile("(" + source + "\n)", "<test>", "eval")
    except (SyntaxError, ValueError):
        return mode, None  # a test that does not compile fails


def _describe(error):
    return "".join(traceback.format_exception_only(type(error), error)).strip()[-500:]


def _make_error_reporter(errors):
    """The workers' sys.unraisablehook: describes the exception that ended a step."""

    def report(unraisable):
        try:
            text = _describe(unraisable.exc_value)
        except BaseException:  # noqa: BLE001 - a description is best effort
            text = "an exception that could not be described"
        errors.put((unraisable.exc_type is MemoryError, text))
        gc.collect(0)  # as at the end of a step that did not raise (see _make_stepper)

    return report


def _hand_over_sentinel(set_sentinel=_SET_SENTINEL):
    """Runs first on a worker (Python <= 3.12): a held lock that is released when the thread ends.

    A thread has one sentinel; a later _set_sentinel() on the worker replaces this one
    and the step then waits for the wall-clock limit (score 0). threading calls it when
    first imported, for its _MainThread: hence the import above, on the main thread.
    """
    lock = set_sentinel()
    lock.acquire()
    return lock


def _make_server(key, report_fd, namespace, errors, *, exec=exec, eval=eval):
    """The main thread's part, as closures over primitives bound before any submitted code runs:
    `serve(solution, compile_error, tests)` runs each step, reads its value, reports, exits."""
    encode = _make_encoder()
    queue = _queue.SimpleQueue()  # values from the workers; referenced only from C and from here
    missing = object()
    kept = []  # every value stays alive, so no finaliser of the solution's runs on this thread
    step = _make_stepper(queue, namespace, missing, kept)
    failure = _make_failure(errors, kept)
    finish = _make_finish(key, report_fd)

    def serve(solution, compile_error, tests):
        if solution is None:
            finish(compile_error, None)
        if step(0, exec, solution) is missing:
            finish(failure() or "exited before finishing (SystemExit)", None)
        failure()
        index, reported = 0, []
        for steps in tests:
            values = []
            for mode, code in steps:
                index += 1
                run = exec if mode == "exec" else eval
                value = missing if code is None else step(index, run, code)
                failure()  # a MemoryError anywhere ends the run
                if value is missing:
                    break  # the test fails
                values.append(value)
            reported.append("[" + ",".join([encode(value) for value in values]) + "]")
        finish(None, reported)

    return serve


def _make_stepper(
    queue,
    namespace,
    missing,
    kept,
    *,
    # Bound now: the solution may rebind builtins and module attributes later.
    deque=deque, map=map, zip=zip, chain=chain, starmap=starmap, partial=partial,
    collect=gc.collect, start=_thread.start_new_thread, hand_over_sentinel=_hand_over_sentinel,
    start_joinable=_START_JOINABLE, Empty=_queue.Empty, exit=os._exit,
):  # fmt: skip
    """`step(index, run, code)`: run(code, namespace) on a fresh worker; its value, or `missing`."""

    def start_worker(index, values):
        """Start a worker that queues (index, value) for each of `values`; returns its `ended`."""
        # After the value, a collection of the youngest generation, on the worker: the few
        # objects this thread allocates then never start one here, so no finaliser of the
        # solution's runs on this thread unless the solution tampers with the gc thresholds.
        work = chain(map(queue.put, zip([index], values)), starmap(collect, [(0,)]))
        if start_joinable is not None:
            handle = start_joinable(partial(deque, work, 0))
            return lambda timeout: handle.join(timeout) or handle.is_done()
        # The worker first hands over a lock that is released when its thread state is deleted.
        hand_over = map(queue.put, zip([index], starmap(hand_over_sentinel, [()])))
        start(deque, (chain(hand_over, work), 0))
        got, sentinel = queue.get()
        if got != index:
            exit(1)
        state = [False]

        def ended(timeout):
            state[0] = state[0] or sentinel.acquire(True, timeout)
            return state[0]

        return ended

    def step(index, run, code):
        """Run one step on a fresh worker: its value, or `missing` when the worker died."""
        ended = start_worker(index, map(run, [code], [namespace]))
        got, value = index, missing
        while True:
            try:
                got, value = queue.get(True, 0.005)
                break
            except Empty:
                if ended(0):  # ended without a value, or just after queueing it
                    if not queue.empty():
                        got, value = queue.get_nowait()
                    break
        if got != index:
            exit(1)
        while not ended(0.01):  # let the worker finish before anything else runs
            pass
        kept.append(value)
        return value

    return step


def _make_failure(errors, kept, *, type=type, len=len, str=str, exit=os._exit):
    """`failure()`: the last description the workers reported; ends the run on a MemoryError."""

    def failure():
        text = None
        while not errors.empty():
            item = errors.get_nowait()
            kept.append(item)
            if type(item) is tuple and len(item) == 2 and type(item[1]) is str:
                if item[0] is True:
                    exit(MEMORY_EXIT)
                text = item[1]
        return text

    return failure


def _make_finish(
    key, report_fd, *, len=len, blake2b=blake2b, pwrite=os.pwrite, exit=os._exit,
    quote=_json.encode_basestring_ascii,
):  # fmt: skip
    """`finish(error, tests)`: write the report signed with the run's key, then exit 0."""

    def finish(error, tests):
        if error is not None:
            payload = '{"error":' + quote(error) + ',"tests":[]}'
        else:
            payload = '{"error":null,"tests":[' + ",".join(tests) + "]}"
        data = payload.encode()
        data += b"\n" + blake2b(data, key=key, digest_size=32).hexdigest().encode() + b"\n"
        written = 0
        while written < len(data):
            written += pwrite(report_fd, data[written:], written)
        exit(0)

    return finish


def _make_encoder(
    *,
    type=type, issubclass=issubclass, Exception=Exception, ValueError=ValueError,
    bool=bool, int=int, float=float, str=str, list=list, tuple=tuple, dict=dict, set=set,
    frozenset=frozenset, bytes=bytes, bytearray=bytearray, complex=complex,
    as_int=int.__int__, as_float=float.__float__, as_str=str.__str__, int_text=int.__repr__,
    float_text=float.__repr__, quote=_json.encode_basestring_ascii, list_items=list.__iter__,
    tuple_items=tuple.__iter__, dict_items=dict.items, set_items=set.__iter__,
    frozenset_items=frozenset.__iter__, bytes_hex=bytes.hex, bytearray_hex=bytearray.hex,
    real=complex.real.__get__, imag=complex.imag.__get__, mro_of=type.__dict__["__mro__"].__get__,
    dict_of=type.__dict__["__dict__"].__get__, infinity=float("inf"), max_depth=_MAX_DEPTH,
):  # fmt: skip
    """`encode(value)`: the value as tagged JSON, read without calling any of its methods.

    null, true/false, numbers, strings and lists are JSON's own; everything else is a
    one-key object: {"t": [...]} tuple, {"s"/"fs": [...]} set/frozenset, {"d": [[k, v], ...]}
    dict, {"f": "nan"/"inf"/"-inf"}, {"b"/"ba": hex} bytes/bytearray, {"c": [re, im]}
    complex, {"o": true/null} any other object (true: truthy without running its code),
    {"u": null} a value that could not be read (too deep, a cycle, too large).
    A subclass of a built-in type is read as the built-in value it stores.
    """

    def number(value):
        if value != value:
            return '{"f":"nan"}'
        if value == infinity or value == -infinity:
            return '{"f":"inf"}' if value > 0 else '{"f":"-inf"}'
        return float_text(value)

    def many(items, depth):
        return ",".join([walk(item, depth + 1) for item in items])

    def walk(value, depth):
        kind = type(value)
        if value is None:
            return "null"
        if kind is bool:
            return "true" if value is True else "false"
        if issubclass(kind, int):
            return int_text(as_int(value))
        if issubclass(kind, float):
            return number(as_float(value))
        if issubclass(kind, str):
            return quote(as_str(value))
        if depth >= max_depth:
            raise ValueError("too deep")
        if issubclass(kind, list):
            return "[" + many(list_items(value), depth) + "]"
        if issubclass(kind, tuple):
            return '{"t":[' + many(tuple_items(value), depth) + "]}"
        if issubclass(kind, dict):
            pairs = [
                "[" + walk(k, depth + 1) + "," + walk(v, depth + 1) + "]"
                for k, v in dict_items(value)
            ]
            return '{"d":[' + ",".join(pairs) + "]}"
        if issubclass(kind, frozenset):
            return '{"fs":[' + many(frozenset_items(value), depth) + "]}"
        if issubclass(kind, set):
            return '{"s":[' + many(set_items(value), depth) + "]}"
        if issubclass(kind, bytes):
            return '{"b":' + quote(bytes_hex(value)) + "}"
        if issubclass(kind, bytearray):
            return '{"ba":' + quote(bytearray_hex(value)) + "}"
        if issubclass(kind, complex):
            return '{"c":[' + number(real(value)) + "," + number(imag(value)) + "]}"
        for klass in mro_of(kind):  # truthy by default unless a class defines __bool__ or __len__
            attributes = dict_of(klass)
            if "__bool__" in attributes or "__len__" in attributes:
                return '{"o":null}'
        return '{"o":true}'

    def encode(value):
        try:
            return walk(value, 0)
        except Exception:  # noqa: BLE001 - RecursionError, MemoryError, huge ints: not readable
            return '{"u":null}'

    return encode
