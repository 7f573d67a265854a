// grpcgrade-grpc-face: grpcgrade's public gRPC port served natively, in front of the engine's process.
//
// Why Go: a Python gRPC server spends 250-290 us of CPU on a unary call (grpc.aio or the sync server,
// measured on 2 cores with `grpcgrade bench --per-sample`), which bounds any Python face below the 3x the
// FastAPI peer the per-sample goal asks; grpc-go's server answered the same crowd at ~20 us a call.
//
// It does what the Python gRPC face processes do (grpcgrade/service/grpc_face.py), and nothing more:
//   - Evaluate: concurrent calls with the same plan gathered into BatchEvaluateUnary calls (BatchEvaluate
//     for an answer over one message) to the engine's process on its private Unix socket (coalesce.go);
//     a call it cannot split, or whose chunk the engine refused for what a request holds, goes to the
//     engine as the plain Evaluate it was.
//   - every other method the engine serves: relayed as bytes, with the call's deadline, metadata and
//     cancellation, and the engine's status and trailers back (relay.go).
//   - auth: the server's bearer tokens (the auth token file), checked before a request is read; the health
//     service is open, as on the server's own port.
//   - bounds: at most --max-calls calls in flight (past it RESOURCE_EXHAUSTED with the retry hint at once),
//     the message size limit both ways, the server's keepalive and connection-age settings, and its
//     connection bounds: at most --max-connections open (connections.go), --handshake-timeout to finish
//     TLS and the HTTP/2 preface, --idle-timeout without a call.
//   - counts: to the server's process as JSON lines on stdout (counts.go), which serves them on /metrics.
//
// It is started by the server's process (grpcgrade.service.native_face) with the listening socket of the
// public port as an inherited file descriptor, and ends on SIGTERM (draining for --grace) or when its
// stdin closes (the server's process has gone).
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/keepalive"
)

// raw is the codec of every call: messages stay bytes (the face parses only what wire.go reads). It takes
// the name "proto" so that it is the codec of calls with gRPC's default content type.
type raw struct{}

func (raw) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }
func (raw) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = data
	return nil
}
func (raw) Name() string { return "proto" }

type options struct {
	listenFD        int
	engine          string
	tokenFile       string
	maxMessageBytes int
	maxCalls        int
	retryAfter      float64
	linger          float64
	maxChunk        int
	grace           float64
	maxConnections  int
	handshake       float64
	idle            float64
	methods         string
	buckets         string
	tlsCert, tlsKey string
	tlsClientCA     string
	floor           bool
}

func parseOptions() options {
	var o options
	flag.IntVar(&o.listenFD, "listen-fd", 3, "the inherited listening socket of the public port")
	flag.StringVar(&o.engine, "engine", "", "the engine process's private address (unix:PATH)")
	flag.StringVar(&o.tokenFile, "token-file", "", "the auth token file (one token a line; none: no auth)")
	flag.IntVar(&o.maxMessageBytes, "max-message-bytes", 64<<20, "the largest message either way")
	flag.IntVar(&o.maxCalls, "max-calls", 10000, "calls in flight at most; past it RESOURCE_EXHAUSTED")
	flag.Float64Var(&o.retryAfter, "retry-after", 1.0, "the retry hint of a refusal for load (seconds)")
	flag.Float64Var(&o.linger, "linger", 0.01, "how long calls of a plan gather while one of its chunks is graded (seconds)")
	flag.IntVar(&o.maxChunk, "max-chunk", 1024, "samples in one chunk at most")
	flag.Float64Var(&o.grace, "grace", 25, "how long in-flight calls may finish after SIGTERM (seconds)")
	flag.IntVar(&o.maxConnections, "max-connections", 10000, "connections open at once; past it a new one is closed at once")
	flag.Float64Var(&o.handshake, "handshake-timeout", 10, "how long a new connection may take to finish TLS and the HTTP/2 preface (seconds)")
	flag.Float64Var(&o.idle, "idle-timeout", 300, "how long a connection without a call stays open (seconds)")
	flag.StringVar(&o.methods, "methods", "{}", "JSON: every method the engine serves (/service/Method) and its kind")
	flag.StringVar(&o.buckets, "buckets", "", "the handling-time histogram's upper bounds (seconds, comma-separated, +Inf last)")
	flag.StringVar(&o.tlsCert, "tls-cert", "", "the server certificate (PEM)")
	flag.StringVar(&o.tlsKey, "tls-key", "", "its key (PEM)")
	flag.StringVar(&o.tlsClientCA, "tls-client-ca", "", "client certificates' CA: mutual TLS")
	flag.BoolVar(&o.floor, "floor", false, "answer every call at once with an empty message, touching no engine: "+
		"the floor of `grpcgrade bench --per-sample`, what grpc-go itself costs a call")
	flag.Parse()
	return o
}

// readTokens reads the auth token file as the Python server does (options.read_tokens).
func readTokens(path string) ([]string, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var tokens []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			tokens = append(tokens, line)
		}
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("%s: no token in the auth token file", path)
	}
	return tokens, nil
}

func parseBounds(text string) ([]float64, error) {
	var out []float64
	for _, part := range strings.Split(text, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if part == "+Inf" || part == "inf" {
			out = append(out, 1e308)
			continue
		}
		v, err := strconv.ParseFloat(part, 64)
		if err != nil {
			return nil, fmt.Errorf("--buckets: %v", err)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		out = []float64{1e308}
	}
	return out, nil
}

func credentialsOf(o options) (grpc.ServerOption, error) {
	if o.tlsCert == "" {
		return nil, nil
	}
	pair, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
	if err != nil {
		return nil, err
	}
	config := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if o.tlsClientCA != "" {
		pem, err := os.ReadFile(o.tlsClientCA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no certificate", o.tlsClientCA)
		}
		config.ClientCAs, config.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return grpc.Creds(credentials.NewTLS(config)), nil
}

func main() {
	o := parseOptions()
	report := &reporter{out: os.Stdout}
	if err := serve(o, report); err != nil {
		report.send(line{Error: err.Error()})
		fmt.Fprintln(os.Stderr, "grpcgrade-grpc-face:", err)
		os.Exit(1)
	}
}

func serve(o options, report *reporter) error {
	encoding.RegisterCodec(raw{})
	tokens, err := readTokens(o.tokenFile)
	if err != nil {
		return err
	}
	kinds := map[string]string{}
	if err := json.Unmarshal([]byte(o.methods), &kinds); err != nil {
		return fmt.Errorf("--methods: %v", err)
	}
	bounds, err := parseBounds(o.buckets)
	if err != nil {
		return err
	}
	listener, err := net.FileListener(os.NewFile(uintptr(o.listenFD), "public port"))
	if err != nil {
		return fmt.Errorf("the public port's socket (fd %d): %v", o.listenFD, err)
	}
	engine, err := grpc.Dial(o.engine, grpc.WithInsecure(), grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(o.maxMessageBytes), grpc.MaxCallSendMsgSize(o.maxMessageBytes)))
	if err != nil {
		return fmt.Errorf("the engine's address %s: %v", o.engine, err)
	}
	defer engine.Close()
	c := newCounts(bounds, kinds)
	f := &face{
		engine: engine, kinds: kinds, counts: c, tokens: tokens,
		maxCalls: int64(o.maxCalls), retryAfter: o.retryAfter,
		coalescer: &coalescer{
			plans: map[string]*plan{}, linger: time.Duration(o.linger * float64(time.Second)),
			maxChunk: o.maxChunk, maxBytes: o.maxMessageBytes, engine: engine, counts: c,
		},
	}
	if len(tokens) > 0 {
		f.coalescer.token = tokens[0]
	}
	grace := seconds(o.grace)
	handler := f.handle
	if o.floor {
		handler = floor
	}
	serverOptions := []grpc.ServerOption{
		grpc.UnknownServiceHandler(handler),
		grpc.MaxRecvMsgSize(o.maxMessageBytes),
		grpc.MaxSendMsgSize(o.maxMessageBytes),
		// The Python server's keepalive, connection age and connection bounds (options.public_server_options).
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time: 60 * time.Second, Timeout: 20 * time.Second,
			MaxConnectionAge: 30 * time.Minute, MaxConnectionAgeGrace: grace,
			MaxConnectionIdle: seconds(o.idle),
		}),
		grpc.ConnectionTimeout(seconds(o.handshake)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	creds, err := credentialsOf(o)
	if err != nil {
		return fmt.Errorf("TLS: %v", err)
	}
	if creds != nil {
		serverOptions = append(serverOptions, creds)
	}
	server := grpc.NewServer(serverOptions...)
	stopCounting := make(chan struct{})
	counted := make(chan struct{})
	go func() { report.every(c, stopCounting); close(counted) }()
	served := make(chan error, 1)
	go func() { served <- server.Serve(capConnections(listener, o.maxConnections)) }()
	report.send(line{Ready: listener.Addr().(*net.TCPAddr).Port})

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	parentGone := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(parentGone) }()
	select {
	case <-stop:
	case <-parentGone:
	case err := <-served:
		return err
	}
	// No new connection or call; in-flight calls finish for up to the grace period.
	drained := make(chan struct{})
	go func() { server.GracefulStop(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(grace):
		server.Stop()
	}
	close(stopCounting)
	<-counted
	return nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// floor answers a call with an empty message (a valid EvaluateResponse: every field at its default).
func floor(_ interface{}, stream grpc.ServerStream) error {
	var request []byte
	if err := stream.RecvMsg(&request); err != nil {
		return err
	}
	response := []byte{}
	return stream.SendMsg(&response)
}
