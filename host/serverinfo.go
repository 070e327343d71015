package host

import (
	"fmt"
	goruntime "runtime"
	"runtime/debug"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/host/rpc"
)

// Version is the moehost module's version from the binary's build info:
// a tag such as "v0.3.1" when built from a tagged module, "(devel)" when
// built in the repository, or "unknown" without build info.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if bi.Main.Path == "github.com/moehost/moehost" && bi.Main.Version != "" {
		return bi.Main.Version
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/moehost/moehost" {
			return d.Version
		}
	}
	return "(devel)"
}

// describer is the server as ServerService sees it.
type describer Server

// Describe reports the server as it is now. Announce addresses and peers
// stay empty until the server runs a DHT node.
func (d *describer) Describe() *moehostv1.GetServerInfoResponse {
	d.mu.Lock()
	start, addr, n, dev := d.startTime, d.addr, len(d.sorted), d.dev
	d.mu.Unlock()
	res := &moehostv1.GetServerInfoResponse{
		Version:       Version(),
		ListenAddress: addr,
		ExpertCount:   int32(n),
		GoVersion:     goruntime.Version(),
	}
	if dev != nil {
		res.Devices = []*moehostv1.DeviceInfo{{
			Name:        dev.Name(),
			Description: fmt.Sprintf("%s/%s, %d threads", goruntime.GOOS, goruntime.GOARCH, goruntime.GOMAXPROCS(0)),
		}}
	}
	if !start.IsZero() {
		res.StartTime = timestamppb.New(start)
		res.UptimeSeconds = time.Since(start).Seconds()
	}
	return res
}

var _ rpc.Server = (*describer)(nil)
