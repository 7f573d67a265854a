package main

// The face's counts, sent to the server's process as JSON lines on stdout every batchInterval (the Python
// face processes' `counters.BATCH_SECONDS`): the same go-grpc-prometheus series the server's own port
// counts (started, received, sent, handled by code, the handling-time histogram), and the coalescer's
// chunks and samples. Each line holds what changed since the last: counters as increments, the histogram
// as per-bucket increments and the sum, so a crowd of calls is one line, not a message a call. The calls the
// face refused for its in-flight bound go as `refused`: the server's process counts them in
// grpcgrade_calls_refused_total under the bound's own label (core/admission.py's PENDING_CALLS).

import (
	"encoding/json"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
)

const batchInterval = 50 * time.Millisecond

// codeNames are gRPC's status codes as the Python server's metrics name them (grpc.StatusCode's names).
var codeNames = [...]string{
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
	"PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}

// methodCounts are one method's counters, moved with atomics by its calls.
type methodCounts struct {
	labels            [3]string // kind (unary, server_stream, client_stream, bidi_stream), service, method
	started, received int64
	sent              int64
	handled           [len(codeNames)]int64
	buckets           []int64 // calls per histogram bucket (not cumulative), the last one +Inf
	sumNanos          int64
	last              snapshot
}

type snapshot struct {
	started, received, sent int64
	handled                 [len(codeNames)]int64
	buckets                 []int64
	sumNanos                int64
}

// counts holds every method's counters and the coalescer's.
type counts struct {
	bounds  []float64 // the histogram's upper bounds in seconds, +Inf last (the server's own buckets)
	methods map[string]*methodCounts
	order   []string
	chunks  int64
	samples int64
	refused int64    // calls refused for the in-flight bound (--max-calls)
	sentAt  [3]int64 // chunks, samples, refused at the last line
	mu      sync.Mutex
}

func newCounts(bounds []float64, kinds map[string]string) *counts {
	c := &counts{bounds: bounds, methods: map[string]*methodCounts{}}
	for method, kind := range kinds {
		service, name := splitMethod(method)
		m := &methodCounts{labels: [3]string{kind, service, name}}
		m.buckets = make([]int64, len(bounds))
		m.last.buckets = make([]int64, len(bounds))
		c.methods[method] = m
		c.order = append(c.order, method)
	}
	sort.Strings(c.order)
	return c
}

func splitMethod(method string) (string, string) {
	for i := len(method) - 1; i >= 0; i-- {
		if method[i] == '/' {
			service := method[:i]
			if len(service) > 0 && service[0] == '/' {
				service = service[1:]
			}
			return service, method[i+1:]
		}
	}
	return "", method
}

// handled counts a call's end: its code and how long it took.
func (m *methodCounts) finish(code codes.Code, elapsed time.Duration, bounds []float64) {
	if int(code) < len(codeNames) {
		atomic.AddInt64(&m.handled[code], 1)
	} else {
		atomic.AddInt64(&m.handled[codes.Unknown], 1)
	}
	seconds := elapsed.Seconds()
	i := sort.SearchFloat64s(bounds, seconds) // the first bound >= seconds: prometheus_client's `le`
	if i >= len(bounds) {
		i = len(bounds) - 1
	}
	atomic.AddInt64(&m.buckets[i], 1)
	atomic.AddInt64(&m.sumNanos, int64(elapsed))
}

// line is one message to the server's process.
type line struct {
	Count   [][3]interface{} `json:"count,omitempty"` // [name, labels, amount]
	Hist    [][4]interface{} `json:"hist,omitempty"`  // [name, labels, per-bucket increments, sum]
	Chunks  int64            `json:"chunks,omitempty"`
	Samples int64            `json:"samples,omitempty"`
	Refused int64            `json:"refused,omitempty"`
	Ready   int              `json:"ready,omitempty"`
	Error   string           `json:"error,omitempty"`
}

// delta is what changed since the last line (and marks it sent).
func (c *counts) delta() line {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out line
	for _, method := range c.order {
		m := c.methods[method]
		labels := m.labels[:]
		add := func(name string, now int64, last *int64, extra ...string) {
			if now != *last {
				out.Count = append(out.Count, [3]interface{}{name, append(append([]string{}, labels...), extra...), now - *last})
				*last = now
			}
		}
		add("started", atomic.LoadInt64(&m.started), &m.last.started)
		add("received", atomic.LoadInt64(&m.received), &m.last.received)
		add("sent", atomic.LoadInt64(&m.sent), &m.last.sent)
		for code := range m.handled {
			add("handled", atomic.LoadInt64(&m.handled[code]), &m.last.handled[code], codeNames[code])
		}
		var increments []int64
		moved := false
		for i := range m.buckets {
			now := atomic.LoadInt64(&m.buckets[i])
			increments = append(increments, now-m.last.buckets[i])
			moved = moved || now != m.last.buckets[i]
			m.last.buckets[i] = now
		}
		if moved {
			sum := atomic.LoadInt64(&m.sumNanos)
			seconds := float64(sum-m.last.sumNanos) / 1e9
			m.last.sumNanos = sum
			out.Hist = append(out.Hist, [4]interface{}{"handling", labels, increments, seconds})
		}
	}
	chunks, samples, refused := atomic.LoadInt64(&c.chunks), atomic.LoadInt64(&c.samples), atomic.LoadInt64(&c.refused)
	out.Chunks, out.Samples, out.Refused = chunks-c.sentAt[0], samples-c.sentAt[1], refused-c.sentAt[2]
	c.sentAt = [3]int64{chunks, samples, refused}
	return out
}

func (l line) empty() bool {
	return len(l.Count) == 0 && len(l.Hist) == 0 && l.Chunks == 0 && l.Samples == 0 && l.Refused == 0 &&
		l.Ready == 0 && l.Error == ""
}

// reporter writes lines to the server's process, one writer at a time.
type reporter struct {
	mu  sync.Mutex
	out io.Writer
}

func (r *reporter) send(l line) {
	if l.empty() {
		return
	}
	data, err := json.Marshal(l)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.out.Write(append(data, '\n'))
}

// every sends the counts' changes every batchInterval until `stop` is closed, and once more then.
func (r *reporter) every(c *counts, stop <-chan struct{}) {
	tick := time.NewTicker(batchInterval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			r.send(c.delta())
		case <-stop:
			r.send(c.delta())
			return
		}
	}
}
