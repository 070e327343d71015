package swarm_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moehost/moehost/sdk/swarm"
)

// TestNewNodeDoesNotWaitForAHangingPeer gives a node two initial peers:
// a live one, and one whose port accepts connections and never answers
// (a hung host). NewNode returns joined to the live one while its dial
// to the other is still open, rather than once that dial gave up.
func TestNewNodeDoesNotWaitForAHangingPeer(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		for {
			select {
			case c := <-held:
				c.Close()
			default:
				return
			}
		}
	})
	hungID, err := swarm.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	hung := "/ip4/127.0.0.1/tcp/" + strings.TrimPrefix(l.Addr().String(), "127.0.0.1:") + "/p2p/" + hungID.PeerID()
	live := startNode(t, swarm.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := swarm.NewNode(ctx, swarm.Config{InitialPeers: append([]string{hung}, live.Addrs()...)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if !slices.Equal(n.Peers(), []string{live.PeerID()}) {
		t.Errorf("peers %v, want the live one, %s", n.Peers(), live.PeerID())
	}
	var c net.Conn
	select {
	case c = <-held:
	default:
		t.Fatal("NewNode returned before it dialed the hanging peer")
	}
	held <- c // for the cleanup
	// Past what the node sent (its handshake), a read that times out
	// finds the dial still open; one that ends finds that the node gave
	// up on the peer before NewNode returned.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	if _, err := io.Copy(io.Discard, c); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the dial to the hanging peer ended (%v) before NewNode returned", err)
	}
}

// TestNodeRedialsARestartedPeer closes a node that another joined
// through and starts it again with the same identity and address: the
// other dials it again by peer ID, and is connected to it again within
// two redial periods.
func TestNodeRedialsARestartedPeer(t *testing.T) {
	t.Parallel()
	const period = 500 * time.Millisecond
	id, err := swarm.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := swarm.NewNode(ctx, swarm.Config{Identity: id})
	if err != nil {
		t.Fatal(err)
	}
	addrs := first.Addrs()
	n := startNode(t, swarm.Config{InitialPeers: addrs, RedialPeriod: period})
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	// The listen address is the dialed one, less its /p2p/ part.
	listen := strings.TrimSuffix(addrs[0], "/p2p/"+id.PeerID())
	for swarm.ConnectedTo(n, id.PeerID()) {
		time.Sleep(10 * time.Millisecond) // until n saw it go
	}
	startNode(t, swarm.Config{Identity: id, Listen: []string{listen}})
	begin := time.Now()
	for !swarm.ConnectedTo(n, id.PeerID()) {
		if time.Since(begin) > 2*period {
			t.Fatalf("the restarted peer is not back within %v", 2*period)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
