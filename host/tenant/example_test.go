package tenant_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/moehost/moehost/host/tenant"
)

// Example shows what a server does with a tenants file: authenticate a
// token, check a deploy against the tenant's prefixes and the operator's
// uids, resolve its caps, and reload on SIGHUP.
func Example() {
	dir, _ := os.MkdirTemp("", "tenants")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, tenant.FileName)

	// What `moehost tenant add alice --prefix alice --cap-experts 8` does.
	var token string
	_ = tenant.Edit(path, func(f *tenant.File) (err error) {
		token, err = f.Add("alice", []string{"alice"}, tenant.Caps{Experts: 8})
		return err
	})

	// The server: experts from the command line are the operator's.
	tenants, err := tenant.Open(path, tenant.WithOperatorUIDs("alice.0"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tenants.WatchSIGHUP(context.Background(), nil)()

	name, ok := tenants.Authenticate(token)
	fmt.Println(name, ok)
	fmt.Println(tenants.MayDeploy(name, "alice.[1:4]"))
	fmt.Println(tenants.MayDeploy(name, "alice.[0:4]"))
	fmt.Println(tenants.MayDeploy(name, "alicex.0"))
	caps, _ := tenants.Caps(name, tenant.Caps{Modules: 16})
	fmt.Println(caps.Experts, caps.Modules, caps.Admit(tenant.Usage{Experts: 8}, tenant.Usage{Experts: 1}))
	// Output:
	// alice true
	// <nil>
	// "alice.[0:4]" overlaps "alice.0", which the operator reserved
	// "alicex.0" is outside tenant "alice"'s prefixes (alice)
	// 8 16 the tenant's experts cap is 8 and this needs 9
}
