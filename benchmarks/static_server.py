"""A static metrics server for the benchmarks: serves one file's bytes at any path, keep-alive,
TCP_NODELAY, in its own process (so its CPU is not counted). Run: python -c STATIC_SERVER FILE [moving].

`moving` (benchmarks/direct_vs_prometheus_bench.py --moving): each path's answers move the way a busy
replica's do, one step per request to that path (whoever asks): every counter (`_total`), histogram
bucket and `_count` up by 3 per step (all buckets of a series alike, so they stay cumulative), each
`_sum` up by 1.25, running and waiting requests and KV usage changing; `_created` and info series stay.
64 bodies are made up front (a trial asks each path far fewer times), so serving costs no more.
`idle=SECONDS`: a connection idle that long is closed, as uvicorn (vLLM's server, whose keep-alive
timeout is 5 s by default) closes it, so a scraper asking every 15 s connects anew each time."""

STATIC_SERVER = r"""
import math, socket, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
body = open(sys.argv[1], 'rb').read()
MOVING = 'moving' in sys.argv[2:]
IDLE = [float(a[5:]) for a in sys.argv[2:] if a.startswith('idle=')]
def step(line, k):
    if not line or line.startswith('#'):
        return line
    head, _, token = line.rpartition(' ')
    name = head.split('{', 1)[0]
    try:
        v = float(token)
    except ValueError:
        return line
    if not math.isfinite(v) or name.endswith('_created'):
        return line
    if name.endswith(('_bucket', '_count', '_total')):
        v += 3 * k
    elif name.endswith('_sum'):
        v += 1.25 * k
    elif name.endswith(('num_requests_running', 'num_requests_waiting')):
        v += k % 4
    elif name.endswith(('kv_cache_usage_perc', 'gpu_cache_usage_perc')):
        v = (k % 10) / 10
    else:
        return line
    return head + ' ' + repr(v)
bodies = [body]
if MOVING:
    text = body.decode()
    bodies = [('\n'.join(step(l, k) for l in text.split('\n'))).encode() for k in range(64)]
asked = {}
lock = threading.Lock()
class H(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    timeout = IDLE[0] if IDLE else None  # a read idle that long ends the connection
    def log_message(self, *a): pass
    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    def do_GET(self):
        with lock:
            n = asked.get(self.path, 0)
            asked[self.path] = n + 1
        out = bodies[n % len(bodies)]
        self.send_response(200)
        self.send_header('Content-Type', 'text/plain; version=0.0.4; charset=utf-8')
        self.send_header('Content-Length', str(len(out)))
        self.end_headers()
        self.wfile.write(out)
s = ThreadingHTTPServer(('127.0.0.1', 0), H)
s.daemon_threads = True
print(s.server_address[1], flush=True)
s.serve_forever()
"""
