package main

// Each call of the public port: admitted (the in-flight bound), authenticated, counted, then Evaluate
// coalesced and every other method relayed to the engine's process.

import (
	"context"
	"crypto/subtle"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

const (
	evaluate     = "/grpcgrade.v1.GradingService/Evaluate"
	callerHeader = "x-grpcgrade-caller"
	// The trailer gRPC's retry policy reads as the server's retry hint (service/overload.py's PUSHBACK_KEY).
	pushbackKey = "grpc-retry-pushback-ms"
	// core/errors.py's OVERLOADED and interceptors.py's UNAUTHENTICATED_MESSAGE: the same words as the server's.
	overloaded      = "server busy"
	unauthenticated = "missing or invalid bearer token"
	// Services every caller may use without a token (interceptors.OPEN_SERVICES): probes.
	openService = "grpc.health.v1.Health/"
)

type face struct {
	engine     *grpc.ClientConn
	coalescer  *coalescer
	kinds      map[string]string
	counts     *counts
	tokens     []string
	inFlight   int64
	maxCalls   int64
	retryAfter float64
}

// handle is every call's handler (the server knows no service of its own: grpc.UnknownServiceHandler).
func (f *face) handle(_ interface{}, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	m := f.counts.methods[method]
	if m == nil {
		return status.Errorf(codes.Unimplemented, "Method not found: %s", method)
	}
	atomic.AddInt64(&m.started, 1)
	t0 := time.Now()
	err := f.admitted(method, m, stream)
	code := status.Code(err)
	if err != nil {
		if ctxErr := stream.Context().Err(); ctxErr != nil && (code == codes.Canceled || code == codes.Unknown) {
			code = status.FromContextError(ctxErr).Code()
		}
	}
	m.finish(code, time.Since(t0), f.counts.bounds)
	return err
}

func (f *face) admitted(method string, m *methodCounts, stream grpc.ServerStream) error {
	if !f.allowed(method, stream.Context()) {
		return status.Error(codes.Unauthenticated, unauthenticated) // the request is never read
	}
	if atomic.AddInt64(&f.inFlight, 1) > f.maxCalls {
		atomic.AddInt64(&f.inFlight, -1)
		atomic.AddInt64(&f.counts.refused, 1) // as the server's own refusals are: grpcgrade_calls_refused_total
		hint := int64(f.retryAfter*1000 + 0.5)
		if hint < 1 {
			hint = 1
		}
		stream.SetTrailer(metadata.Pairs(pushbackKey, strconv.FormatInt(hint, 10)))
		return status.Errorf(codes.ResourceExhausted, "%s: %d calls in flight on the gRPC face (limits.max_pending_calls); retry in %g s",
			overloaded, f.maxCalls, f.retryAfter)
	}
	defer atomic.AddInt64(&f.inFlight, -1)
	if method == evaluate {
		return f.evaluate(m, stream)
	}
	return f.relay(method, m, stream)
}

// allowed: open services and a server without tokens always; otherwise `authorization: Bearer <token>`,
// compared in constant time (interceptors.ServiceInterceptor.allowed).
func (f *face) allowed(method string, ctx context.Context) bool {
	if len(f.tokens) == 0 || strings.HasPrefix(strings.TrimPrefix(method, "/"), openService) {
		return true
	}
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get("authorization")
	if len(values) == 0 {
		return false
	}
	scheme, token := values[0], ""
	if i := strings.IndexByte(scheme, ' '); i >= 0 {
		scheme, token = scheme[:i], scheme[i+1:]
	}
	if strings.ToLower(scheme) != "bearer" {
		return false
	}
	presented := []byte(strings.TrimSpace(token))
	ok := false
	for _, t := range f.tokens {
		if subtle.ConstantTimeCompare(presented, []byte(t)) == 1 {
			ok = true
		}
	}
	return ok
}

// carried is the call's metadata a relayed call carries (all but HTTP/2's and gRPC's own: grpc_face.carried).
func carried(ctx context.Context) metadata.MD {
	in, _ := metadata.FromIncomingContext(ctx)
	out := metadata.MD{}
	for k, v := range in {
		switch {
		case k == "user-agent", k == "te", k == "content-type", k == "host",
			strings.HasPrefix(k, "grpc-"), strings.HasPrefix(k, ":"):
			continue
		}
		out[k] = v
	}
	return out
}

func (f *face) evaluate(m *methodCounts, stream grpc.ServerStream) error {
	var request []byte
	if err := stream.RecvMsg(&request); err != nil {
		return err
	}
	atomic.AddInt64(&m.received, 1)
	ctx := stream.Context()
	s, err := splitEvaluate(request)
	if err == nil {
		caller := ""
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			if v := md.Get(callerHeader); len(v) > 0 {
				caller = v[0]
			}
		}
		a := f.coalescer.grade(ctx, s, caller)
		if !a.relay {
			if a.err != nil {
				if len(a.trailer) > 0 {
					stream.SetTrailer(a.trailer)
				}
				return a.err
			}
			return f.send(m, stream, a.response)
		}
	}
	// A call the face does not split, or whose chunk the engine refused for what a request holds: the
	// engine's own Evaluate answers it.
	var response []byte
	var trailer metadata.MD
	err = f.engine.Invoke(metadata.NewOutgoingContext(ctx, carried(ctx)), evaluate, &request, &response, grpc.Trailer(&trailer))
	if len(trailer) > 0 {
		stream.SetTrailer(trailer)
	}
	if err != nil {
		return asTheEngine(status.Convert(err))
	}
	return f.send(m, stream, response)
}

func (f *face) send(m *methodCounts, stream grpc.ServerStream, response []byte) error {
	if err := stream.SendMsg(&response); err != nil {
		return err
	}
	atomic.AddInt64(&m.sent, 1)
	return nil
}

// relay makes the same call to the engine's process with the call's bytes, deadline, metadata and
// cancellation, and answers with the engine's messages, status and trailers. Every kind of method is one
// stream both ways (gRPC's unary calls are streams of one message on the wire).
func (f *face) relay(method string, m *methodCounts, stream grpc.ServerStream) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel() // the face's call gone (or ended): the engine's call ends too
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	engine, err := f.engine.NewStream(metadata.NewOutgoingContext(ctx, carried(ctx)), desc, method)
	if err != nil {
		return asTheEngine(status.Convert(err))
	}
	go func() { // the caller's messages to the engine
		for {
			var message []byte
			if err := stream.RecvMsg(&message); err != nil {
				if err == io.EOF {
					_ = engine.CloseSend()
				} else {
					cancel()
				}
				return
			}
			atomic.AddInt64(&m.received, 1)
			if err := engine.SendMsg(&message); err != nil {
				return // the engine's call ended: its status comes from RecvMsg
			}
		}
	}()
	for {
		var message []byte
		err := engine.RecvMsg(&message)
		if err != nil {
			if trailer := engine.Trailer(); len(trailer) > 0 {
				stream.SetTrailer(trailer)
			}
			if err == io.EOF {
				return nil
			}
			return asTheEngine(status.Convert(err))
		}
		if err := f.send(m, stream, message); err != nil {
			return err
		}
	}
}
