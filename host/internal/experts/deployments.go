package experts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moehost/moehost/gpuhost"
	"github.com/moehost/moehost/host/internal/batch"
	"github.com/moehost/moehost/internal/atomicfile"
	"github.com/moehost/moehost/internal/expertlimits"
	"github.com/moehost/moehost/modules"
	"github.com/moehost/moehost/sdk/wire"
)

// Access says who may call one of an expert's methods (see wire.Access).
// The zero Access means public.
type Access = wire.Access

// The accesses.
const (
	AccessPublic  = wire.AccessPublic
	AccessOwner   = wire.AccessOwner
	AccessTenants = wire.AccessTenants
)

// deploymentsFile holds the live deployments under the data dir, so that
// they come back after a restart.
const deploymentsFile = "deployments.json"

// deployment is one live deployment as the file keeps it: the module by
// digest, from the module store.
type deployment struct {
	UID            string                   `json:"uid"`
	Owner          string                   `json:"owner,omitempty"`
	Module         string                   `json:"module"`
	Config         map[string]int64         `json:"config,omitempty"`
	Batching       *batch.Limits            `json:"batching,omitempty"`
	Optimizer      *gpuhost.OptimizerConfig `json:"optimizer,omitempty"`
	ForwardAccess  Access                   `json:"forward_access,omitempty"`
	BackwardAccess Access                   `json:"backward_access,omitempty"`
	Limits         *expertlimits.Limits     `json:"limits,omitempty"`
}

func (d deployment) expertConfig() Spec {
	return Spec{
		UID: d.UID, Owner: d.Owner, Module: ModuleDigest(d.Module), Config: d.Config,
		Batching: d.Batching, Optimizer: d.Optimizer,
		ForwardAccess: d.ForwardAccess, BackwardAccess: d.BackwardAccess, Limits: d.Limits,
	}
}

// readDeployments reads the deployments file; a missing one is empty.
func readDeployments(dataDir string) ([]deployment, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, deploymentsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading deployments: %w", err)
	}
	var ds []deployment
	if err := json.Unmarshal(b, &ds); err != nil {
		return nil, fmt.Errorf("reading deployments: %s: %w", deploymentsFile, err)
	}
	return ds, nil
}

// writeDeployments replaces the deployments file atomically.
func writeDeployments(dataDir string, ds []deployment) error {
	slices.SortFunc(ds, func(a, b deployment) int { return strings.Compare(a.UID, b.UID) })
	b, err := json.MarshalIndent(ds, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dataDir, deploymentsFile), append(b, '\n')); err != nil {
		return fmt.Errorf("writing deployments: %w", err)
	}
	return nil
}

// saveDeployments writes the live deployments (the experts deployed
// while serving, not the configured ones). Call with the loader's mu
// held, so that writes follow deploys in order.
func (r *Registry) saveDeployments(l *loader) error {
	var ds []deployment
	for _, e := range r.All() {
		if e.tenancy.deployed != nil {
			ds = append(ds, *e.tenancy.deployed)
		}
	}
	for _, d := range l.unrestored {
		ds = append(ds, d)
	}
	return writeDeployments(r.cfg.DataDir, ds)
}

// restoreDeployments deploys what the deployments file holds, before
// Ready. A deployment that no longer loads (its module gone or refused,
// its uid now configured) is logged and kept in the file, so that nothing
// an owner deployed is lost to one bad start.
func (r *Registry) restoreDeployments(ctx context.Context, l *loader) error {
	ds, err := readDeployments(r.cfg.DataDir)
	if err != nil {
		return err
	}
	for _, d := range ds {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("starting: %w", err)
		}
		ec := d.expertConfig()
		err := ec.Validate(r.ckpt != nil)
		if _, taken := r.Get(d.UID); taken {
			err = errors.New("its uid is served already")
		}
		if d.Owner != modules.Operator && r.cfg.HasTenant != nil && !r.cfg.HasTenant(d.Owner) {
			err = errors.New("its owner is not a tenant of this server")
		}
		var e *Expert
		if err == nil {
			e, _, err = r.load(ctx, l, ec)
		}
		if err != nil {
			r.log.Error("deployment not restored", "uid", d.UID, "owner", d.Owner, "err", err)
			l.unrestored[d.UID] = d
			continue
		}
		e.tenancy.deployed = &d
		r.Schedule(e)
		r.put(e)
	}
	return nil
}
