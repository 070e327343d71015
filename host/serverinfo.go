package host

import (
	"fmt"
	"runtime"
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

// Describe reports the server as it is now: its devices with their
// tensor memory, and its DHT node when it runs one.
func (d *describer) Describe() *moehostv1.GetServerInfoResponse {
	s := (*Server)(d)
	s.mu.Lock()
	start, addr, n := s.startTime, s.addr, len(s.sorted)
	s.mu.Unlock()
	res := &moehostv1.GetServerInfoResponse{
		Version:          Version(),
		ListenAddress:    addr,
		ExpertCount:      int32(n),
		GoVersion:        runtime.Version(),
		MemoryLimitBytes: s.MemoryLimit(),
	}
	for _, m := range s.MemoryStats() {
		res.Devices = append(res.Devices, &moehostv1.DeviceInfo{
			Name:            m.Device,
			Description:     fmt.Sprintf("%s/%s, %d threads", runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0)),
			LiveTensorBytes: m.LiveBytes,
			PeakTensorBytes: m.PeakBytes,
			PoolBytes:       m.PoolBytes,
			PoolHitRate:     m.HitRate(),
		})
	}
	if !start.IsZero() {
		res.StartTime = timestamppb.New(start)
		res.UptimeSeconds = time.Since(start).Seconds()
	}
	if info, ok := s.DHT(); ok {
		res.PeerId, res.DhtAddresses, res.DhtRecords, res.AnnounceAddresses = info.PeerID, info.Addrs, info.Records, info.URLs
		for _, p := range info.Peers {
			res.Peers = append(res.Peers, &moehostv1.PeerInfo{PeerId: p})
		}
	}
	return res
}

var _ rpc.Server = (*describer)(nil)
