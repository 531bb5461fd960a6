//! The HCA opcodes (`mlx5_ifc.h` `MLX5_CMD_OP_*`; docs/reference/mlx5.md §d): one list, from which the
//! constants, their names (the identifier without `MLX5_CMD_OP_`) and the name parser are generated
//! ([`crate::command::codes!`]). Each `ifc` module re-exports the opcodes of its commands, so
//! `ifc::qp::MLX5_CMD_OP_CREATE_QP` and `ifc::opcode::MLX5_CMD_OP_CREATE_QP` are one constant.
//!
//! The device model keeps a table of its own (qemu/mlx5-model): a checker shares no code with what it checks.

crate::command::codes! {
    /// Every opcode the driver names, `(value, name)`, in numeric order.
    ALL: [u16], prefix "MLX5_CMD_OP_";
    /// The opcode's name (`"CREATE_MKEY"`), `None` for an opcode the list does not hold.
    fn name;
    /// The opcode named `name`, as [`name`] spells it.
    fn from_name;
    // Bring-up, pages, capabilities (`ifc::init`).
    MLX5_CMD_OP_QUERY_HCA_CAP = 0x100;
    /// Not sent by the driver; named for traces.
    MLX5_CMD_OP_QUERY_ADAPTER = 0x101;
    MLX5_CMD_OP_INIT_HCA = 0x102;
    MLX5_CMD_OP_TEARDOWN_HCA = 0x103;
    MLX5_CMD_OP_ENABLE_HCA = 0x104;
    MLX5_CMD_OP_DISABLE_HCA = 0x105;
    MLX5_CMD_OP_QUERY_PAGES = 0x107;
    MLX5_CMD_OP_MANAGE_PAGES = 0x108;
    MLX5_CMD_OP_SET_HCA_CAP = 0x109;
    MLX5_CMD_OP_QUERY_ISSI = 0x10a;
    MLX5_CMD_OP_SET_ISSI = 0x10b;
    // Memory keys (`ifc::mkey`) and the special contexts (`ifc::eth`).
    MLX5_CMD_OP_CREATE_MKEY = 0x200;
    MLX5_CMD_OP_QUERY_MKEY = 0x201;
    MLX5_CMD_OP_DESTROY_MKEY = 0x202;
    MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS = 0x203;
    // Event queues (`ifc::eq`).
    MLX5_CMD_OP_CREATE_EQ = 0x301;
    MLX5_CMD_OP_DESTROY_EQ = 0x302;
    MLX5_CMD_OP_QUERY_EQ = 0x303;
    // Completion queues (`ifc::cq`).
    MLX5_CMD_OP_CREATE_CQ = 0x400;
    MLX5_CMD_OP_DESTROY_CQ = 0x401;
    MLX5_CMD_OP_QUERY_CQ = 0x402;
    // Queue pairs (`ifc::qp`).
    MLX5_CMD_OP_CREATE_QP = 0x500;
    MLX5_CMD_OP_DESTROY_QP = 0x501;
    MLX5_CMD_OP_RST2INIT_QP = 0x502;
    MLX5_CMD_OP_INIT2RTR_QP = 0x503;
    MLX5_CMD_OP_RTR2RTS_QP = 0x504;
    /// Not sent by the driver; named for traces.
    MLX5_CMD_OP_RTS2RTS_QP = 0x505;
    MLX5_CMD_OP_2ERR_QP = 0x507;
    MLX5_CMD_OP_2RST_QP = 0x50a;
    MLX5_CMD_OP_QUERY_QP = 0x50b;
    // The vport and its RoCE addresses (`ifc::vport`), Q counters (`ifc::eth`).
    MLX5_CMD_OP_QUERY_VPORT_STATE = 0x750;
    MLX5_CMD_OP_QUERY_NIC_VPORT_CONTEXT = 0x754;
    MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT = 0x755;
    MLX5_CMD_OP_QUERY_ROCE_ADDRESS = 0x760;
    MLX5_CMD_OP_SET_ROCE_ADDRESS = 0x761;
    /// Not sent by the driver; named for traces.
    MLX5_CMD_OP_QUERY_HCA_VPORT_CONTEXT = 0x762;
    /// Not sent by the driver; named for traces.
    MLX5_CMD_OP_QUERY_HCA_VPORT_GID = 0x764;
    MLX5_CMD_OP_ALLOC_Q_COUNTER = 0x771;
    MLX5_CMD_OP_DEALLOC_Q_COUNTER = 0x772;
    MLX5_CMD_OP_QUERY_Q_COUNTER = 0x773;
    // Protection and transport domains, UAR pages (`ifc::resources`), register access (`ifc::init`).
    MLX5_CMD_OP_ALLOC_PD = 0x800;
    MLX5_CMD_OP_DEALLOC_PD = 0x801;
    MLX5_CMD_OP_ALLOC_UAR = 0x802;
    MLX5_CMD_OP_DEALLOC_UAR = 0x803;
    MLX5_CMD_OP_ACCESS_REG = 0x805;
    MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN = 0x816;
    MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN = 0x817;
    // Ethernet objects (`ifc::eth`) and flow steering (`ifc::flow`).
    MLX5_CMD_OP_CREATE_TIR = 0x900;
    MLX5_CMD_OP_DESTROY_TIR = 0x902;
    MLX5_CMD_OP_CREATE_SQ = 0x904;
    MLX5_CMD_OP_MODIFY_SQ = 0x905;
    MLX5_CMD_OP_DESTROY_SQ = 0x906;
    MLX5_CMD_OP_QUERY_SQ = 0x907;
    MLX5_CMD_OP_CREATE_RQ = 0x908;
    MLX5_CMD_OP_MODIFY_RQ = 0x909;
    MLX5_CMD_OP_DESTROY_RQ = 0x90a;
    MLX5_CMD_OP_QUERY_RQ = 0x90b;
    MLX5_CMD_OP_CREATE_TIS = 0x912;
    MLX5_CMD_OP_DESTROY_TIS = 0x914;
    MLX5_CMD_OP_SET_FLOW_TABLE_ROOT = 0x92f;
    MLX5_CMD_OP_CREATE_FLOW_TABLE = 0x930;
    MLX5_CMD_OP_DESTROY_FLOW_TABLE = 0x931;
    /// Not sent by the driver; named for traces.
    MLX5_CMD_OP_QUERY_FLOW_TABLE = 0x932;
    MLX5_CMD_OP_CREATE_FLOW_GROUP = 0x933;
    MLX5_CMD_OP_DESTROY_FLOW_GROUP = 0x934;
    /// Not sent by the driver; named for traces.
    MLX5_CMD_OP_QUERY_FLOW_GROUP = 0x935;
    MLX5_CMD_OP_SET_FLOW_TABLE_ENTRY = 0x936;
    /// Not sent by the driver; named for traces.
    MLX5_CMD_OP_QUERY_FLOW_TABLE_ENTRY = 0x937;
    MLX5_CMD_OP_DELETE_FLOW_TABLE_ENTRY = 0x938;
}
