"""The committed gRPC stubs match a fresh generation from controller/api/stoke.proto."""

from controller.api.generate import API_DIR, fresh_stubs


def test_committed_stubs_match_fresh_generation():
    fresh = fresh_stubs()
    assert set(fresh) == {"stoke_pb2.py", "stoke_pb2_grpc.py", "stoke_pb2.pyi"}
    stale = [name for name, text in fresh.items() if (API_DIR / name).read_text() != text]
    assert not stale, f"stale stubs {stale}: run `python -m controller.api.generate`"
