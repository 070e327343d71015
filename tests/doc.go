// Package tests holds moehost's end-to-end and architecture tests: they
// build or start the real thing and check it from the outside.
package tests
