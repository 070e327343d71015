package host

import (
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/moehost/moehost/host/internal/rpc"
	"github.com/moehost/moehost/host/internal/ui"
	"github.com/moehost/moehost/host/tenant"
	"github.com/moehost/moehost/modules"
)

// dashboardAPI is what the dashboard reads beside the Connect services.
func (s *Server) dashboardAPI() ui.API {
	view := new(swarmView)
	api := ui.API{
		History: s.history,
		Experts: s.dashboardExperts,
		Swarm:   func() ui.Swarm { return view.get(s) },
	}
	if s.tenants != nil {
		api.Tenants = s.dashboardTenants
	}
	return api
}

// errBadToken is a dashboard request's refusal of a token that nobody
// holds, in the words of the Connect services' own.
var errBadToken = errors.New("the bearer token is not valid on this server")

// dashboardCaller is who a dashboard request's Authorization header h
// says its caller is, as the Connect services would say: without tenants
// they take no token and everyone is anonymous; with them, no token is
// anonymous and one that nobody holds is refused.
func (s *Server) dashboardCaller(h http.Header) (rpc.Caller, error) {
	if s.tenants == nil {
		return rpc.Caller{}, nil
	}
	token, present, err := rpc.BearerToken(h)
	if err != nil || !present {
		return rpc.Caller{}, err
	}
	c, ok := authenticator{s}.Authenticate(token)
	if !ok {
		return rpc.Caller{}, errBadToken
	}
	return c, nil
}

// dashboardExperts are the rates and last checkpoints of the experts that
// ListExperts would list to h's caller: those whose Forward it may call.
// Each rate is the expert's mean over the history's rate window, from the
// same ticks as the throughput chart, whose value is their sum.
func (s *Server) dashboardExperts(h http.Header) (ui.Experts, error) {
	c, err := s.dashboardCaller(h)
	if err != nil {
		return ui.Experts{}, err
	}
	rates := s.history.Rates(nil)
	out := ui.Experts{RateWindowMs: s.history.RateWindow().Milliseconds(), Experts: []ui.Expert{}}
	for _, e := range s.experts.All() {
		owner, fwd, _ := e.Access()
		if c.Check(fwd, owner, "") != nil {
			continue
		}
		x := ui.Expert{UID: e.UID()}
		if i, ok := slices.BinarySearchFunc(rates, x.UID, func(r ui.ExpertRows, uid string) int { return strings.Compare(r.UID, uid) }); ok {
			x.RowsPerSecond = rates[i].RowsPerSecond
		}
		if step, at, ok := s.experts.LastCheckpoint(x.UID); ok {
			x.Checkpoint = &ui.Checkpoint{Step: step, UnixMs: at.UnixMilli()}
		}
		out.Experts = append(out.Experts, x)
	}
	return out, nil
}

// errTenantsNeedToken refuses the tenants view to an anonymous caller:
// which tenants exist and what they uploaded is theirs and the
// operator's business, as ModuleService's ListModules is.
var errTenantsNeedToken = errors.New("the tenants and their modules need a token (Authorization: Bearer <token>): a tenant's for its own, the server's --admin-token for all")

// dashboardTenants is the tenants view of h's caller: the admin token
// sees every tenant and every module, the operator's included; a
// tenant's token sees that tenant alone, as ListModules does.
func (s *Server) dashboardTenants(h http.Header) (ui.Tenants, error) {
	c, err := s.dashboardCaller(h)
	if err != nil {
		return ui.Tenants{}, err
	}
	if c.Anonymous() {
		return ui.Tenants{}, errTenantsNeedToken
	}
	out := ui.Tenants{Tenants: []ui.Tenant{}, Modules: []ui.Module{}}
	store, _ := s.experts.LiveStore() // nil before the server runs
	mods := func(owner string) []ui.Module {
		if store == nil {
			return nil
		}
		var list []ui.Module
		for _, m := range store.List(owner) {
			in := moduleAPI{s}.info(owner, m)
			list = append(list, ui.Module{Owner: owner, Digest: in.Digest, Name: in.Name, SizeBytes: in.Size,
				UploadedUnixMs: in.Created.UnixMilli(), Experts: nonNil(in.Experts)})
		}
		return list
	}
	if c.Operator {
		out.Modules = append(out.Modules, mods(modules.Operator)...)
	}
	tenants := s.tenants.Tenants()
	slices.SortFunc(tenants, func(a, b tenant.Tenant) int { return strings.Compare(a.Name, b.Name) })
	for _, t := range tenants {
		if !c.Operator && t.Name != c.Tenant {
			continue
		}
		m := mods(t.Name)
		var uids []string
		for _, e := range s.experts.OwnedBy(t.Name) {
			uids = append(uids, e.UID())
		}
		out.Tenants = append(out.Tenants, ui.Tenant{Name: t.Name, Prefixes: nonNil(t.Prefixes), Tokens: t.Tokens(),
			Modules: len(m), Experts: nonNil(uids)})
		out.Modules = append(out.Modules, m...)
	}
	return out, nil
}

// nonNil is v, or an empty slice for nil: JSON's [] rather than null.
func nonNil[T any](v []T) []T {
	if v == nil {
		return []T{}
	}
	return v
}
