package main

// Unary Evaluate calls gathered by plan into BatchEvaluateUnary calls to the engine's process, with the Python
// gRPC face's rule (grpcgrade.core.coalesce: ServerCoalescer, FACE_LINGER_SECONDS): a call whose
// plan has no chunk being graded leaves at once (with whoever arrived meanwhile); while one is, calls of
// that plan gather for up to `linger`; a full chunk (maxChunk samples, or half the message limit in bytes)
// leaves at once. A call gone before its chunk leaves is left out; once every call of a chunk being graded
// has gone, the chunk's call to the engine is cancelled, and with it the work in the engine's workers.

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

const (
	batchEvaluate      = "/grpcgrade.v1.GradingService/BatchEvaluate"
	batchEvaluateUnary = "/grpcgrade.v1.GradingService/BatchEvaluateUnary"
)

// answer is one call's outcome: its EvaluateResponse, or the engine's status (with its trailers), or
// `relay`: the engine refused the chunk for a reason of a request's own (a bad plan, a bad sample), or its
// answer as a batch item lost details the call's own answer keeps, and the call goes to the engine alone,
// which answers it as its own port does.
type answer struct {
	response []byte
	err      error
	trailer  metadata.MD
	relay    bool
}

type waiter struct {
	sample []byte
	done   chan answer // buffered: the chunk never waits for a caller
	chunk  *chunk      // set when its chunk leaves
	gone   bool
}

type chunk struct {
	alive  int
	cancel context.CancelFunc
}

type plan struct {
	key     string
	head    []byte
	caller  string
	waiting []*waiter
	bytes   int
	running int
	timer   *time.Timer
}

type coalescer struct {
	mu       sync.Mutex
	plans    map[string]*plan
	linger   time.Duration
	maxChunk int
	maxBytes int
	engine   *grpc.ClientConn
	token    string // the server's token, which the engine's private socket asks for (empty: none)
	counts   *counts
}

// grade answers one call's sample with its plan's; `caller` is the call's x-grpcgrade-caller (the
// judges' fair share: a chunk carries one caller's name, so calls of different callers never share one).
func (c *coalescer) grade(ctx context.Context, s split, caller string) answer {
	if len(s.sample)+len(s.plan) >= c.maxBytes/2 {
		// A sample this large shares no chunk (a chunk must stay within the message limit): the call goes
		// to the engine as it came, within the limit the face received it under.
		return answer{relay: true}
	}
	key := caller + "\x00" + string(s.plan)
	w := &waiter{sample: s.sample, done: make(chan answer, 1)}
	c.mu.Lock()
	p := c.plans[key]
	if p == nil {
		p = &plan{key: key, head: s.plan, caller: caller}
		c.plans[key] = p
	}
	p.waiting = append(p.waiting, w)
	p.bytes += len(s.sample) + 8
	if len(p.waiting) >= c.maxChunk || p.bytes >= c.maxBytes/2 {
		c.flushLocked(p)
	} else if p.timer == nil {
		delay := time.Duration(0)
		if p.running > 0 {
			delay = c.linger
		}
		p.timer = time.AfterFunc(delay, func() { c.flush(p) })
	}
	c.mu.Unlock()
	select {
	case a := <-w.done:
		return a
	case <-ctx.Done():
		c.mu.Lock()
		w.gone = true
		if w.chunk != nil {
			w.chunk.alive--
			if w.chunk.alive == 0 {
				w.chunk.cancel() // every caller of the chunk has gone: so has its work
			}
		}
		c.mu.Unlock()
		return answer{err: status.FromContextError(ctx.Err()).Err()}
	}
}

func (c *coalescer) flush(p *plan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushLocked(p)
}

func (c *coalescer) flushLocked(p *plan) {
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	var batch []*waiter
	taken, size := 0, 0
	for _, w := range p.waiting {
		if len(batch) >= c.maxChunk || (len(batch) > 0 && size+len(w.sample) >= c.maxBytes/2) {
			break
		}
		taken++
		if w.gone {
			continue
		}
		batch = append(batch, w)
		size += len(w.sample) + 8
	}
	p.waiting = p.waiting[taken:]
	p.bytes = 0
	for _, w := range p.waiting {
		p.bytes += len(w.sample) + 8
	}
	if len(p.waiting) > 0 { // more than a chunk waited: the rest goes at once too
		p.timer = time.AfterFunc(0, func() { c.flush(p) })
	}
	if len(batch) == 0 {
		c.forget(p)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := &chunk{alive: len(batch), cancel: cancel}
	for _, w := range batch {
		w.chunk = ch
	}
	p.running++
	go c.run(ctx, cancel, p, batch)
}

// forget drops a plan with nothing waiting or running (the plans held stay as many as are in use).
func (c *coalescer) forget(p *plan) {
	if p.running == 0 && len(p.waiting) == 0 && p.timer == nil && c.plans[p.key] == p {
		delete(c.plans, p.key)
	}
}

func (c *coalescer) run(ctx context.Context, cancel context.CancelFunc, p *plan, batch []*waiter) {
	defer cancel()
	samples := make([][]byte, len(batch))
	for i, w := range batch {
		samples[i] = w.sample
	}
	atomic.AddInt64(&c.counts.chunks, 1)
	atomic.AddInt64(&c.counts.samples, int64(len(batch)))
	md := metadata.MD{}
	if c.token != "" {
		md.Set("authorization", "Bearer "+c.token)
	}
	if p.caller != "" {
		md.Set(callerHeader, p.caller)
	}
	answered := make([]bool, len(batch))
	count := 0
	wrapped, request := batchRequest(p.head, samples)
	err := c.call(metadata.NewOutgoingContext(ctx, md), wrapped, request, func(it item) error {
		if it.index >= uint64(len(batch)) || answered[it.index] {
			return status.Errorf(codes.Internal, "the grading engine answered sample %d of %d twice or out of range", it.index, len(batch))
		}
		answered[it.index] = true
		count++
		if size := leftOutSize(it.result); size >= 0 && size <= int64(c.maxBytes) {
			// The engine left out this answer's details to fit it in a batch item, a few bytes more than
			// the answer; the answer alone fits the call's message, and the engine's own Evaluate sends it
			// whole: the call goes there (graded again, alone), so the face answers as the engine's port.
			batch[it.index].done <- answer{relay: true}
			return nil
		}
		batch[it.index].done <- answer{response: it.result}
		return nil
	})
	if err == nil && count != len(batch) { // never expected: the engine answers every sample it takes
		err = status.Errorf(codes.Internal, "the grading engine answered %d of %d samples", count, len(batch))
	}
	if err != nil {
		failed := failure(err)
		for i, w := range batch {
			if !answered[i] {
				w.done <- failed
			}
		}
	}
	c.mu.Lock()
	p.running--
	c.forget(p)
	c.mu.Unlock()
}

// call grades a chunk, each item of its answer to `each`: one BatchEvaluateUnary (`wrapped`), which costs
// the engine's process less than a stream for a chunk answered whole; BatchEvaluate (`batch`, streamed in
// parts) when the engine refused it for an answer over one message (the faces' link's rule, service/link.py:
// RESOURCE_EXHAUSTED without a retry hint; a refusal for load carries one and is the calls' answer).
func (c *coalescer) call(ctx context.Context, wrapped, batch []byte, each func(item) error) error {
	var response []byte
	var trailer metadata.MD
	err := c.engine.Invoke(ctx, batchEvaluateUnary, &wrapped, &response, grpc.Trailer(&trailer))
	if err == nil {
		answer, perr := unaryAnswer(response)
		if perr != nil {
			return status.Errorf(codes.Internal, "the grading engine's answer could not be read: %v", perr)
		}
		return c.each(answer, each)
	}
	if status.Code(err) != codes.ResourceExhausted || len(trailer.Get(pushbackKey)) > 0 {
		return withTrailer(err, trailer)
	}
	return c.stream(ctx, batch, each)
}

// stream makes one BatchEvaluate with `request`, each item of its answer to `each`.
func (c *coalescer) stream(ctx context.Context, request []byte, each func(item) error) error {
	var trailer metadata.MD
	stream, err := c.engine.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, batchEvaluate, grpc.Trailer(&trailer))
	if err != nil {
		return withTrailer(err, trailer)
	}
	if err := stream.SendMsg(&request); err != nil && err != io.EOF {
		return withTrailer(err, trailer)
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	for {
		var message []byte
		err := stream.RecvMsg(&message)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return withTrailer(err, stream.Trailer())
		}
		if err := c.each(message, each); err != nil {
			return err
		}
	}
}

// each gives `each` every item of one BatchEvaluateResponse.
func (c *coalescer) each(message []byte, each func(item) error) error {
	items, err := batchItems(message)
	if err != nil {
		return status.Errorf(codes.Internal, "the grading engine's answer could not be read: %v", err)
	}
	for _, it := range items {
		if err := each(it); err != nil {
			return err
		}
	}
	return nil
}

// engineError is an engine call's status with the trailers it ended with (a retry hint among them).
type engineError struct {
	st      *status.Status
	trailer metadata.MD
}

func (e *engineError) Error() string { return e.st.Err().Error() }

func withTrailer(err error, trailer metadata.MD) error {
	return &engineError{st: status.Convert(err), trailer: trailer}
}

// refusedForTheRequest are the codes with which the engine refuses a request for what it holds (an unknown
// grader or reward, bad parameters, a bad sample): each call of such a chunk goes to the engine alone.
var refusedForTheRequest = map[codes.Code]bool{
	codes.InvalidArgument: true, codes.NotFound: true, codes.FailedPrecondition: true, codes.OutOfRange: true,
}

// failure is what a failed chunk answers each of its calls not yet answered.
func failure(err error) answer {
	st, trailer := status.Convert(err), metadata.MD(nil)
	if e, ok := err.(*engineError); ok {
		st, trailer = e.st, e.trailer
	}
	if refusedForTheRequest[st.Code()] {
		return answer{relay: true}
	}
	return answer{err: asTheEngine(st), trailer: trailer}
}

// cannotGrade begins the engine's own refusal while its workers cannot grade (grpcgrade.core.errors.CANNOT_GRADE,
// UNAVAILABLE): relayed as the engine said it, not as an engine that was away.
const cannotGrade = "no worker can grade"

// asTheEngine is the engine call's status as the face's call ends with it; an engine that was away is said so.
func asTheEngine(st *status.Status) error {
	if st.Code() == codes.Unavailable && !strings.HasPrefix(st.Message(), cannotGrade) {
		return status.Error(codes.Unavailable, fmt.Sprintf("the grading engine is not reachable now (%s); retry", st.Message()))
	}
	return st.Err()
}
