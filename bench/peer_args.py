"""How the peer scripts beside peer_bench.py (peer_jax_with_y.py, peer_torch_fp8.py) find it and their configs.

Their arguments: [path of peer_bench.py] [config names]; the path is the first argument when it names a .py file,
else bench/peer_bench.py, the one beside this file.
"""
import importlib.util
import pathlib


def load_peers(argv):
    """(peer_bench module, set of config names to run; empty: all)."""
    if argv and argv[0].endswith(".py"):
        path, names = argv[0], argv[1:]
    else:
        path, names = pathlib.Path(__file__).with_name("peer_bench.py"), argv
    spec = importlib.util.spec_from_file_location("peer_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, set(names)
