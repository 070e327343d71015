// Package grpcreflect asks a server's gRPC reflection (v1) what grpcurl
// asks, with grpc-go's own client, so that tests check reflection as a
// third party's tool speaks it rather than as our handler's own code
// would. Tests of the server, of its Connect edge and of its dashboard
// share it.
package grpcreflect

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
)

// Services returns the names of the services that reflection at addr
// (host:port, plaintext HTTP/2) lists, in its order. It fails t if the
// server does not answer.
func Services(t testing.TB, addr string) []string {
	t.Helper()
	res := ask(t, addr, &reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_ListServices{}})
	var names []string
	for _, s := range res.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names
}

// FileContainingSymbol returns the serialized FileDescriptorProtos that
// reflection at addr gives for symbol (a fully-qualified name), the
// symbol's own file first; none when it does not know the symbol. It
// fails t if the server does not answer.
func FileContainingSymbol(t testing.TB, addr, symbol string) [][]byte {
	t.Helper()
	res := ask(t, addr, &reflectpb.ServerReflectionRequest{MessageRequest: &reflectpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: symbol}})
	return res.GetFileDescriptorResponse().GetFileDescriptorProto()
}

// ask sends req on a fresh connection and stream, and returns the answer.
func ask(t testing.TB, addr string, req *reflectpb.ServerReflectionRequest) *reflectpb.ServerReflectionResponse {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("reflection client for %s: %v", addr, err)
	}
	defer conn.Close()
	stream, err := reflectpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatalf("reflection stream to %s: %v", addr, err)
	}
	defer stream.CloseSend()
	if err := stream.Send(req); err != nil {
		t.Fatalf("reflection request to %s: %v", addr, err)
	}
	res, err := stream.Recv()
	if err != nil {
		t.Fatalf("reflection answer from %s: %v", addr, err)
	}
	return res
}
