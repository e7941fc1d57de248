"""Pickling what fork-server workers run: code keeps its file names, and a failure names its part."""

import pickle
import threading

import pytest

from hydrax.pickling import dumps, unpicklable_part


def make_closure():
    lock = threading.Lock()

    def load(item, arrays, seed):
        with lock:
            return item

    return load


class Holder:
    def __init__(self):
        self.name = "ok"
        self.lock = threading.Lock()


def test_a_function_travels_by_value_with_its_file_name():
    source = "def load(item, arrays, seed):\n    return item + 1\n"
    namespace = {"__name__": "__main__"}
    exec(compile(source, "/srv/train.py", "exec"), namespace)  # as if defined in a training script
    again = pickle.loads(dumps(namespace["load"]))
    assert again(1, None, None) == 2 and again.__code__.co_filename == "/srv/train.py"


def test_the_innermost_unpicklable_part_is_named():
    closure = make_closure()
    try:
        dumps(closure)
    except Exception as exc:
        where, cause = unpicklable_part(closure, "loader_func", exc, dumps)
    assert where == "loader_func's closure variable 'lock'" and "lock" in str(cause)
    holder = Holder()
    with pytest.raises(TypeError) as info:
        dumps({"data": [1, holder]})
    where, _ = unpicklable_part({"data": [1, holder]}, "the data", info.value, dumps)
    assert where == "the data['data'][1].lock"
