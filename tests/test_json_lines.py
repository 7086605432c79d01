"""The grader's servers' JSON-line exchange (distlab.grading.json_lines): replies in order,
descriptors handed over, and a client that failed asks no more."""
import os
import socket
import threading

from distlab.grading.json_lines import Client, answer, requests


def _serve(sock, handle):
    def run():
        with sock:
            for request, fds in requests(sock):
                answer(sock, handle(request, fds))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_told_request_s_reply_is_dropped_before_the_next_asked_one():
    mine, theirs = socket.socketpair()
    served = _serve(theirs, lambda request, fds: {"echo": request["n"]})
    client = Client(mine, timeout=10)
    client.tell({"n": 1})
    client.tell({"n": 2})
    assert client.ask({"n": 3}) == {"echo": 3}
    assert client.ask({"n": 4}) == {"echo": 4}
    client.close()
    served.join(10)
    assert not served.is_alive()   # the server saw the end of its socket


def test_descriptors_go_with_their_request():
    mine, theirs = socket.socketpair()

    def handle(request, fds):
        data = [os.read(fd, 100).decode() for fd in fds]
        for fd in fds:
            os.close(fd)
        return {"read": data}
    _serve(theirs, handle)
    client = Client(mine, timeout=10)
    read, write = os.pipe()
    os.write(write, b"hello")
    os.close(write)
    assert client.ask({"fds": 1}, fds=[read]) == {"read": ["hello"]}
    assert client.ask({"fds": 0}) == {"read": []}
    os.close(read)
    client.close()


def test_a_client_whose_server_did_not_answer_in_time_asks_no_more():
    mine, theirs = socket.socketpair()   # nobody serves theirs: the reply never comes
    client = Client(mine, timeout=0.2)
    reply = client.ask({"n": 1})
    assert "timed out" in reply["error"]
    assert client.closed
    # A reply coming late would be read as the next request's: the client has hung up.
    assert client.ask({"n": 2}) == {"error": "the server was closed"}
    client.tell({"n": 3})   # nothing sent, nothing raised
    theirs.close()


def test_a_server_that_exited_is_an_error_not_a_reply():
    mine, theirs = socket.socketpair()
    theirs.close()
    client = Client(mine, timeout=5)
    reply = client.ask({"n": 1})
    assert "error" in reply and client.closed
