;; mallory.wat: the guest of the front-door tests' attacker
;; (frontdoor_sandbox_test.go). Its schema is the C ffn's at hidden_dim 8
;; (x: float32[-1, 8] -> y: float32[-1, 8]); its config's "mode" picks what
;; moe_forward does:
;;   0  spins forever without calling the host;
;;   1  asks WASI's poll_oneoff for 1 s of sleep (which the sandbox waits
;;      out, off the device), then answers y = x;
;;   2  answers y = x at once.
;;
;; Rebuild: wat2wasm tests/testdata/mallory.wat -o tests/testdata/mallory.wasm
(module
  (import "moehost_v1" "input" (func $input (param i32) (result i32)))
  (import "moehost_v1" "output" (func $output (param i32 i32) (result i32)))
  (import "moehost_v1" "declare_input" (func $declare_input (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "declare_output" (func $declare_output (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "config_i64" (func $config_i64 (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll_oneoff (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; 0 "x", 8 "y", 16 shape [-1 8], 32 "mode", 40 its value, 1024 a
  ;; poll_oneoff subscription, 2048 its event, 2096 the event count.
  (data (i32.const 0) "x")
  (data (i32.const 8) "y")
  (data (i32.const 16) "\ff\ff\ff\ff\ff\ff\ff\ff\08\00\00\00\00\00\00\00")
  (data (i32.const 32) "mode")

  (func (export "moe_abi_version") (result i32) (i32.const 1))

  (func (export "moe_init") (result i32)
    (local $r i32)
    (local.set $r (call $config_i64 (i32.const 32) (i32.const 4) (i32.const 40)))
    (if (i32.lt_s (local.get $r) (i32.const 0)) (then (i64.store (i32.const 40) (i64.const 2))))
    (local.set $r (call $declare_input (i32.const 0) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
    (call $declare_output (i32.const 8) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))

  (func (export "moe_forward") (result i32)
    (local $mode i64)
    (local.set $mode (i64.load (i32.const 40)))
    (if (i64.eqz (local.get $mode)) (then
      (loop $spin (br $spin))))
    (if (i64.eq (local.get $mode) (i64.const 1)) (then
      ;; A relative clock subscription of 1 s on the monotonic clock.
      (i64.store (i32.const 1024) (i64.const 7))          ;; userdata
      (i32.store8 (i32.const 1032) (i32.const 0))         ;; tag: clock
      (i32.store (i32.const 1040) (i32.const 1))          ;; clock id: monotonic
      (i64.store (i32.const 1048) (i64.const 1000000000)) ;; timeout, ns
      (i64.store (i32.const 1056) (i64.const 0))          ;; precision
      (i32.store16 (i32.const 1064) (i32.const 0))        ;; flags: relative
      (drop (call $poll_oneoff (i32.const 1024) (i32.const 2048) (i32.const 1) (i32.const 2096)))))
    (call $output (i32.const 0) (call $input (i32.const 0)))))
