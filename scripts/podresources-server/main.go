// Command podresources-server serves the kubelet's PodResources v1 API (List, Get,
// GetAllocatableResources) on a unix socket, from a JSON file, with the generated server code of
// k8s.io/kubelet's own pkg/apis/podresources/v1 package and grpc-go: the same wire encoding a real
// kubelet sends, so gpulens' agent client is tested against it and not only against its own fake.
//
// The file holds two protojson documents (the field names of api.proto, e.g. "podResources",
// "dynamicResources", "shareId"):
//
//	{"list": <ListPodResourcesResponse>, "allocatable": <AllocatableResourcesResponse>}
//
// It is read again whenever its size or modification time changes, so a test rewrites it (write a
// temporary file and rename it over) to change what the "kubelet" reports. Get answers the pod of
// the list by namespace and name, NOT_FOUND otherwise. Once the socket listens, the program prints
// "listening <socket>" on stdout; SIGTERM or SIGINT stop it gracefully.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// state is one reading of the JSON file.
type state struct {
	size        int64
	modified    time.Time
	list        *v1.ListPodResourcesResponse
	allocatable *v1.AllocatableResourcesResponse
}

type server struct {
	v1.UnimplementedPodResourcesListerServer
	path    string
	mu      sync.Mutex
	current *state
}

// load returns the file's content, read again when it changed since the last call.
func (s *server) load() (*state, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	info, err := os.Stat(s.path)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "pods file: %v", err)
	}
	if s.current != nil && s.current.size == info.Size() && s.current.modified.Equal(info.ModTime()) {
		return s.current, nil
	}
	raw, err := os.ReadFile(s.path)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "pods file: %v", err)
	}
	var doc struct {
		List        json.RawMessage `json:"list"`
		Allocatable json.RawMessage `json:"allocatable"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, status.Errorf(codes.Internal, "pods file %s: %v", s.path, err)
	}
	next := &state{size: info.Size(), modified: info.ModTime(),
		list: &v1.ListPodResourcesResponse{}, allocatable: &v1.AllocatableResourcesResponse{}}
	if len(doc.List) > 0 {
		if err := protojson.Unmarshal(doc.List, next.list); err != nil {
			return nil, status.Errorf(codes.Internal, "pods file %s: list: %v", s.path, err)
		}
	}
	if len(doc.Allocatable) > 0 {
		if err := protojson.Unmarshal(doc.Allocatable, next.allocatable); err != nil {
			return nil, status.Errorf(codes.Internal, "pods file %s: allocatable: %v", s.path, err)
		}
	}
	s.current = next
	return next, nil
}

func (s *server) List(context.Context, *v1.ListPodResourcesRequest) (*v1.ListPodResourcesResponse, error) {
	current, err := s.load()
	if err != nil {
		return nil, err
	}
	return current.list, nil
}

func (s *server) GetAllocatableResources(context.Context, *v1.AllocatableResourcesRequest) (*v1.AllocatableResourcesResponse, error) {
	current, err := s.load()
	if err != nil {
		return nil, err
	}
	return current.allocatable, nil
}

func (s *server) Get(_ context.Context, request *v1.GetPodResourcesRequest) (*v1.GetPodResourcesResponse, error) {
	current, err := s.load()
	if err != nil {
		return nil, err
	}
	for _, pod := range current.list.GetPodResources() {
		if pod.GetName() == request.GetPodName() && pod.GetNamespace() == request.GetPodNamespace() {
			return &v1.GetPodResourcesResponse{PodResources: pod}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "pod %s in namespace %s not found",
		request.GetPodName(), request.GetPodNamespace())
}

func main() {
	socket := flag.String("socket", "", "unix socket to listen on (removed first if it exists)")
	pods := flag.String("pods", "", "JSON file: {\"list\": ..., \"allocatable\": ...} (protojson)")
	flag.Parse()
	if *socket == "" || *pods == "" {
		fmt.Fprintln(os.Stderr, "usage: podresources-server --socket PATH --pods FILE")
		os.Exit(2)
	}
	srv := &server{path: *pods}
	if _, err := srv.load(); err != nil {
		fmt.Fprintln(os.Stderr, "podresources-server:", err)
		os.Exit(1)
	}
	_ = os.Remove(*socket)
	listener, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "podresources-server:", err)
		os.Exit(1)
	}
	grpcServer := grpc.NewServer()
	v1.RegisterPodResourcesListerServer(grpcServer, srv)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		grpcServer.GracefulStop()
	}()
	fmt.Printf("listening %s\n", *socket)
	if err := grpcServer.Serve(listener); err != nil {
		fmt.Fprintln(os.Stderr, "podresources-server:", err)
		os.Exit(1)
	}
	_ = os.Remove(*socket)
}
