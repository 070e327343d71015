;; hostile_init.wat: moe_init floods the host with declarations or calls.
;; The config value "mode" picks what, "count" caps the loop (0: until the
;; host refuses); moe_init returns the host's code, or 0 after count rounds.
;;   mode 0: one-element parameters with distinct names (2M of them once
;;           kept 1,470 MB for 8 MB charged);
;;   mode 1: inputs with distinct names (100k of them once took the 30 s
;;           init timeout, the duplicate check being quadratic);
;;   mode 2: outputs, the same;
;;   mode 3: calls of config_i64 (host calls that do nothing).
(module
  (import "moehost_v1" "config_i64" (func $config_i64 (param i32 i32 i32) (result i32)))
  (import "moehost_v1" "declare_input" (func $declare_input (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "declare_output" (func $declare_output (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "param_new" (func $param_new (param i32 i32 i32 i32 i32 i32 f64 f64) (result i32)))
  (import "moehost_v1" "input" (func $input (param i32) (result i32)))
  (import "moehost_v1" "output" (func $output (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; 0 "x", 8 "y", 16 shape [-1 2], 112 shape [1], 200 the name,
  ;; 240 "mode", 248 "count", 256 config values.
  (data (i32.const 0) "x")
  (data (i32.const 8) "y")
  (data (i32.const 16) "\ff\ff\ff\ff\ff\ff\ff\ff\02\00\00\00\00\00\00\00")
  (data (i32.const 112) "\01\00\00\00\00\00\00\00")
  (data (i32.const 240) "mode")
  (data (i32.const 248) "count")

  (func (export "moe_abi_version") (result i32) (i32.const 1))

  (func (export "moe_init") (result i32)
    (local $r i32) (local $i i32) (local $mode i32) (local $count i32)
    (drop (call $config_i64 (i32.const 240) (i32.const 4) (i32.const 256)))
    (drop (call $config_i64 (i32.const 248) (i32.const 5) (i32.const 264)))
    (local.set $mode (i32.load (i32.const 256)))
    (local.set $count (i32.load (i32.const 264)))
    (local.set $r (call $declare_input (i32.const 0) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
    (local.set $r (call $declare_output (i32.const 8) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
    (loop $more
      ;; The name: i in four base-64 digits, each '0' + digit; "x" and
      ;; "y" are taken by then (i starts at 0: "0000").
      (i32.store (i32.const 200)
        (i32.add (i32.const 0x30303030)
          (i32.or
            (i32.or (i32.and (local.get $i) (i32.const 63))
                    (i32.shl (i32.and (i32.shr_u (local.get $i) (i32.const 6)) (i32.const 63)) (i32.const 8)))
            (i32.or (i32.shl (i32.and (i32.shr_u (local.get $i) (i32.const 12)) (i32.const 63)) (i32.const 16))
                    (i32.shl (i32.and (i32.shr_u (local.get $i) (i32.const 18)) (i32.const 63)) (i32.const 24))))))
      (if (i32.eq (local.get $mode) (i32.const 0)) (then
        (local.set $r (call $param_new (i32.const 200) (i32.const 4) (i32.const 1) (i32.const 112) (i32.const 1)
          (i32.const 1) (f64.const 0) (f64.const 0)))))
      (if (i32.eq (local.get $mode) (i32.const 1)) (then
        (local.set $r (call $declare_input (i32.const 200) (i32.const 4) (i32.const 1) (i32.const 16) (i32.const 2)))))
      (if (i32.eq (local.get $mode) (i32.const 2)) (then
        (local.set $r (call $declare_output (i32.const 200) (i32.const 4) (i32.const 1) (i32.const 16) (i32.const 2)))))
      (if (i32.eq (local.get $mode) (i32.const 3)) (then
        (local.set $r (call $config_i64 (i32.const 240) (i32.const 4) (i32.const 256)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (if (i32.and (i32.ne (local.get $count) (i32.const 0)) (i32.ge_u (local.get $i) (local.get $count)))
        (then (return (i32.const 0))))
      (br_if $more (i32.ge_s (local.get $r) (i32.const 0))))
    (local.get $r))

  (func (export "moe_forward") (result i32)
    (call $output (i32.const 0) (call $input (i32.const 0))))
)
