"""Loopback OpenAI-compatible chat-completions server for the HTTP client tests.

Used by test_http_chat.py, test_verifier_http.py and test_sft_teacher.py (imported as
a sibling module: pytest puts tests/ on sys.path).
"""
import http.server
import json
import threading
import time


class LoopbackChatServer:
  """ThreadingHTTPServer on 127.0.0.1:0 whose replies come from `respond`.

  `respond(n, body)` gets the 1-based request number and the parsed JSON body and
  returns an int (send that HTTP error status), a str (a chat completion with that
  message content) or bytes (a raw 200 body). Every request is recorded in
  `requests` as {'path', 'body', 'auth'}; `max_in_flight` counts the most requests
  handled at once (from reading the request to the reply's first byte); `delay_s`
  delays each reply. `url` is the base URL ('.../v1').
  """

  def __init__(self, respond):
    self.respond = respond
    self.delay_s = 0.0
    self.requests = []
    self.in_flight = 0
    self.max_in_flight = 0
    self.lock = threading.Lock()
    outer = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def log_message(self, *args):  # keep test output quiet
        pass

      def do_POST(self):  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers['Content-Length'])))
        with outer.lock:
          outer.requests.append({'path': self.path, 'body': body,
                                 'auth': self.headers.get('Authorization')})
          n = len(outer.requests)
          outer.in_flight += 1
          outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
        try:
          if outer.delay_s:
            time.sleep(outer.delay_s)
          reply = outer.respond(n, body)
        finally:
          # Out of flight before the first reply byte: a client that has its reply
          # may send its next request before this thread runs again, and counting
          # after the write would see one request too many.
          with outer.lock:
            outer.in_flight -= 1
        try:
          if isinstance(reply, int):
            self.send_error(reply)
            return
          if isinstance(reply, str):
            reply = json.dumps({'choices': [{'message': {
                'role': 'assistant', 'content': reply}}]}).encode()
          self.send_response(200)
          self.send_header('Content-Type', 'application/json')
          self.send_header('Content-Length', str(len(reply)))
          self.end_headers()
          self.wfile.write(reply)
        except (BrokenPipeError, ConnectionResetError):
          pass  # the client timed out and left

    self.httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.httpd.daemon_threads = True
    self.thread = threading.Thread(target=self.httpd.serve_forever,
                                   kwargs={'poll_interval': 0.02}, daemon=True)
    self.thread.start()
    self.url = f'http://127.0.0.1:{self.httpd.server_address[1]}/v1'

  def close(self):
    self.httpd.shutdown()
    self.httpd.server_close()
