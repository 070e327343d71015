package host

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	moehostv1 "github.com/moehost/moehost/gen/moehost/v1"
	"github.com/moehost/moehost/host/internal/rpc"
)

// stampedVersion and stampedCommit are set by the Makefile's ldflags
// (-X github.com/moehost/moehost/host.stampedVersion=...), so that a build
// without Go's VCS stamping (a copy without .git, -buildvcs=false) still
// says what it is.
var stampedVersion, stampedCommit string

// Version is the moehost module's version: the Makefile's stamp, else from
// the binary's build info a tag such as "v0.3.1" when built from a tagged
// module, "(devel)" when built in the repository, or "unknown" without
// build info.
func Version() string {
	if stampedVersion != "" {
		return stampedVersion
	}
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

// Commit is the commit the binary was built from (12 hex digits, with
// "+dirty" for uncommitted changes): Go's VCS stamp, else the Makefile's;
// "" when neither recorded it.
func Commit() string {
	rev, dirty := "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if rev == "" {
		return stampedCommit
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "+dirty"
	}
	return rev
}

// describer is the server as ServerService sees it.
type describer struct{ *Server }

// Describe reports the server as it is now: its devices with their
// tensor memory, and its DHT node when it runs one.
func (d describer) Describe() *moehostv1.GetServerInfoResponse {
	s := d.Server
	s.mu.Lock()
	start, addr := s.front.startTime, s.front.addr
	s.mu.Unlock()
	n := len(s.experts.All())
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
			Description:     deviceDescription(m.Device),
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
			res.Peers = append(res.Peers, &moehostv1.PeerInfo{PeerId: p, Addresses: info.PeerAddrs[p]})
		}
	}
	return res
}

// deviceDescription says, for people, what a device runs on. For the CPU
// it gives the cores this process may use and the threads its kernels run
// on, which differ from GOMAXPROCS: the server sets that one higher than
// the kernel threads (see kernelThreads), so that printing it as "3
// threads" on a 2-core machine misled.
func deviceDescription(name string) string {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	if !strings.HasPrefix(name, "cpu") {
		return platform + " host"
	}
	cores, threads := runtime.NumCPU(), kernelThreads()
	return fmt.Sprintf("%s, %s available, kernels on %s", platform, plural(cores, "core"), plural(threads, "thread"))
}

// plural prints n things: "1 core", "2 cores".
func plural(n int, one string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %ss", n, one)
}

var _ rpc.Server = describer{}

// buildInfo is moehost_build_info, 1 with the version, commit and Go
// version of the binary as labels, so that a dashboard can tell which
// build each server runs (and join it onto the other series).
func buildInfo() prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "moehost", Name: "build_info",
		Help: "Always 1; its labels say which moehost build the server runs.",
	}, []string{"version", "commit", "go_version"})
	g.WithLabelValues(Version(), Commit(), runtime.Version()).Set(1)
	return g
}
