package host

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/moehost/moehost/internal/testing/grpcreflect"
)

// TestReflectionAndHealth does what `grpcurl -plaintext ADDR list` and a
// gRPC health probe do, with grpc-go's own clients.
func TestReflectionAndHealth(t *testing.T) {
	ctx := context.Background()
	conn, err := grpc.NewClient(testServer.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	if names := grpcreflect.Services(t, testServer.Addr()); !slices.Contains(names, "moehost.v1.ExpertService") {
		t.Errorf("reflection lists %v, want moehost.v1.ExpertService among them", names)
	}

	for _, svc := range []string{"", "moehost.v1.ExpertService"} {
		hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("health of %q: %v", svc, err)
		}
		if hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %v, want SERVING", svc, hr.GetStatus())
		}
	}
}
